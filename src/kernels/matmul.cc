// MatMul / MatMulRows / DequantizeRow / MatMulSupports: ISA dispatch, activation quantization
// into a reusable workspace and the split of weight rows across the thread pool. The compute
// kernels live in ref/ (scalar oracle) and cpu/ (AVX2, AVX-512, NEON / dotprod / i8mm).
//
// Workspace: the quantized activations go into a grow-only thread_local buffer, so steady-state
// calls allocate nothing. It is per calling thread (the engine thread), so concurrent MatMul
// calls from different threads are safe; pool workers only read it during the call.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "core/check.h"
#include "core/mapped_file.h"
#include "kernels/isa.h"
#include "kernels/ops.h"
#include "kernels/quant_blocks.h"
#include "kernels/ref/matmul_ref.h"
#include "kernels/work_counter.h"

namespace peng::kernels {
namespace {

// Tokens per pass over the weights: keeps one chunk of quantized activations in L2 while the
// row tiles stream through it.
constexpr int64_t kTokenChunk = 64;
// Rows per thread are rounded to this so every thread runs whole register tiles.
constexpr int64_t kRowAlign = 16;
// From this many tokens a call is compute bound and its rows are dealt dynamically
// (RunPartsDynamic); below, each thread streams one contiguous byte share.
constexpr int64_t kDynamicTokens = 4;

struct Workspace {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> buf;
  size_t bytes = 0;

  uint8_t* Get(size_t n) {
    if (n > bytes) {
      n = (n + 4095) & ~size_t{4095};
      buf.reset(static_cast<uint8_t*>(std::aligned_alloc(64, n)));
      PENG_CHECK(buf != nullptr);
      bytes = n;
    }
    return buf.get();
  }
};

Workspace& ThreadWorkspace() {
  thread_local Workspace ws;
  return ws;
}

int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

MatMulKernel ResolveKernel(DType t, Isa isa) {
  MatMulKernel k = nullptr;
  switch (isa) {
#if defined(__x86_64__)
    case Isa::kAvx2: k = Avx2MatMulKernel(t); break;
    case Isa::kAvx512: k = Avx512MatMulKernel(t); break;
#elif defined(__aarch64__)
    case Isa::kNeon: k = NeonMatMulKernel(t); break;
    case Isa::kNeonDot: k = NeonDotMatMulKernel(t); break;
    case Isa::kNeonI8mm: k = NeonI8mmMatMulKernel(t); break;
#endif
    default: break;
  }
  return k ? k : RefMatMulKernel(t);
}

QuantizeActFn ResolveQuantize(Isa isa) {
  QuantizeActFn f = nullptr;
  switch (isa) {
#if defined(__x86_64__)
    case Isa::kAvx2: f = Avx2QuantizeAct(); break;
    case Isa::kAvx512: f = Avx512QuantizeAct(); break;
#elif defined(__aarch64__)
    case Isa::kNeon:
    case Isa::kNeonDot:
    case Isa::kNeonI8mm: f = NeonQuantizeAct(); break;
#endif
    default: break;
  }
  return f ? f : &ref::QuantizeAct;
}

// Layout of quantized activations for n_tokens rows of cols values (base pointer unset).
// Padding lets SIMD kernels over-read (masked) one block pair past the row end.
ActRows ActLayout(int ab, int64_t n_tokens, int64_t cols, size_t* bytes) {
  ActRows a;
  a.qs_stride = RoundUp(cols, 64) + 64;
  a.d_stride = RoundUp(cols / ab + 2, 16);
  a.sums_stride = RoundUp(cols / 16 + 2, 32);
  // 4-byte values per block: d, and for 32-value blocks neg_sum (int32) and dsum.
  const int64_t word_rows = ab == kQK ? 3 : 1;
  *bytes = static_cast<size_t>(a.qs_stride) * n_tokens +
           sizeof(float) * a.d_stride * n_tokens * word_rows +
           sizeof(int16_t) * a.sums_stride * n_tokens;
  *bytes = (*bytes + 63) & ~size_t{63};
  return a;
}

// Quantizes all token rows of x into `base` (ActLayout's bytes, 64-byte aligned; the thread's
// workspace when null); returns the view.
ActRows QuantizeActivations(DType t, const float* x, int64_t n_tokens, int64_t cols,
                            QuantizeActFn quantize, ThreadPool* pool, uint8_t* base = nullptr) {
  const int ab = ActBlockSize(t);
  PENG_CHECK_MSG(cols % ab == 0, "MatMul: cols must be a multiple of the block size");
  size_t bytes = 0;
  ActRows a = ActLayout(ab, n_tokens, cols, &bytes);
  if (!base) base = ThreadWorkspace().Get(bytes);
  const size_t qs_bytes = static_cast<size_t>(a.qs_stride) * n_tokens;
  const size_t d_bytes = sizeof(float) * a.d_stride * n_tokens;
  int8_t* qs = reinterpret_cast<int8_t*>(base);
  float* d = reinterpret_cast<float*>(base + qs_bytes);
  const bool block32 = ab == kQK;
  int32_t* neg_sum = block32 ? reinterpret_cast<int32_t*>(d + a.d_stride * n_tokens) : nullptr;
  float* dsum = block32 ? d + 2 * a.d_stride * n_tokens : nullptr;
  int16_t* sums = reinterpret_cast<int16_t*>(base + qs_bytes + d_bytes * (block32 ? 3 : 1));
  a.qs = qs;
  a.d = d;
  a.sums = sums;
  a.neg_sum = neg_sum;
  a.dsum = dsum;
  auto run = [&](int64_t t0, int64_t t1) {
    for (int64_t tk = t0; tk < t1; ++tk) {
      int8_t* q = qs + tk * a.qs_stride;
      float* dd = d + tk * a.d_stride;
      int16_t* ss = sums + tk * a.sums_stride;
      quantize(x + tk * cols, cols, ab, q, dd, ss);
      std::fill(q + cols, q + a.qs_stride, int8_t{0});
      std::fill(dd + cols / ab, dd + a.d_stride, 0.f);
      std::fill(ss + cols / 16, ss + a.sums_stride, int16_t{0});
      if (block32) {
        int32_t* ns = neg_sum + tk * a.d_stride;
        float* ds = dsum + tk * a.d_stride;
        for (int64_t b = 0; b < cols / kQK; ++b) {
          const int32_t sum = ss[2 * b] + ss[2 * b + 1];
          ns[b] = -sum;
          ds[b] = dd[b] * static_cast<float>(sum);
        }
        std::fill(ns + cols / kQK, ns + a.d_stride, 0);
        std::fill(ds + cols / kQK, ds + a.d_stride, 0.f);
      }
    }
  };
  ForRows(pool, n_tokens, cols, run);
  return a;
}

}  // namespace

namespace {

bool g_exact_activations = false;

// Exact mode: FP32 copies of quantized weights, made once per tensor and kept for the process
// lifetime (exact mode is for tests and tools, so the memory -- 4 bytes per weight -- is
// acceptable there). Keyed by the weight bytes' address, and checked against the tensor's type,
// shape and a fingerprint of its bytes: a model unloaded and another loaded in the same process
// (tests, tensor-parallel workers) can reuse the address.
uint64_t Fingerprint(const TensorView& w) {
  const auto* p = static_cast<const uint8_t*>(w.data);
  const size_t n = w.size_bytes;
  uint64_t h = 1469598103934665603ull ^ n;  // FNV-1a over 64 samples of 64 bytes
  for (size_t i = 0; i < 64; ++i) {
    const size_t at = n > 64 ? (n - 64) / 63 * i : 0;
    for (size_t k = 0; k < 64 && at + k < n; ++k) h = (h ^ p[at + k]) * 1099511628211ull;
  }
  return h;
}

const TensorView& DequantizedCopy(const TensorView& w) {
  struct Entry {
    TensorView view;  // of `values`
    DType dtype;
    int64_t rows, cols;
    uint64_t fingerprint;
    std::vector<float> values;
  };
  static std::mutex mu;
  static std::unordered_map<const void*, Entry> cache;
  std::lock_guard<std::mutex> lock(mu);
  const uint64_t fp = Fingerprint(w);
  auto it = cache.find(w.data);
  if (it != cache.end() && (it->second.dtype != w.dtype || it->second.rows != w.rows() ||
                            it->second.cols != w.cols() || it->second.fingerprint != fp)) {
    cache.erase(it);  // another tensor now lives at this address
    it = cache.end();
  }
  if (it == cache.end()) {
    Entry e{w, w.dtype, w.rows(), w.cols(), fp, {}};
    e.values.resize(static_cast<size_t>(w.rows() * w.cols()));
    for (int64_t r = 0; r < w.rows(); ++r)
      ref::DequantizeRow(w.dtype, w.row(r), e.values.data() + r * w.cols(), w.cols());
    e.view.dtype = DType::kF32;
    e.view.panels = nullptr;  // (w's panels hold w's type; the F32 kernels have panels too)
    e.view.size_bytes = e.values.size() * sizeof(float);
    it = cache.emplace(w.data, std::move(e)).first;
    it->second.view.data = it->second.values.data();
  }
  return it->second.view;
}

}  // namespace

void SetExactActivations(bool on) { g_exact_activations = on; }
bool ExactActivations() { return g_exact_activations; }

bool MatMulSupports(DType t) { return RefMatMulKernel(t) != nullptr; }

std::shared_ptr<const uint8_t> PackPanels(const TensorView& w) {
#if defined(__x86_64__)
  if (ActiveIsa() != Isa::kAvx512 || w.ndim() != 2) return nullptr;
  const size_t panel = Avx512PanelBytes(w.dtype, w.cols());
  if (panel == 0) return nullptr;
  std::shared_ptr<uint8_t> out = AllocateHugePages(panel * ((w.rows() + 15) / 16));
  if (!out) return nullptr;  // (the row-major matrix still works)
  Avx512PackPanels(w.dtype, static_cast<const uint8_t*>(w.data), w.row_bytes(), w.rows(),
                   w.cols(), out.get());
  return out;
#else
  (void)w;
  return nullptr;
#endif
}

void DequantizeRow(DType t, const void* src, float* dst, int64_t n) {
  PENG_CHECK_MSG(MatMulSupports(t), "DequantizeRow: unsupported type");
  ref::DequantizeRow(t, src, dst, n);
}

namespace {

// One matrix of a MatMulRows / MatMulGroup call, ready for its kernel.
struct Part {
  MatMulArgs args;
  MatMulKernel kernel = nullptr;
  int64_t rows = 0;
};

Part MakePart(const TensorView& w, int64_t row_begin, int64_t row_end, const float* x,
              int64_t n_tokens, float* y, int64_t ldy) {
  Part p;
  p.rows = row_end - row_begin;
  p.kernel = ResolveKernel(w.dtype, ActiveIsa());
  MatMulArgs& args = p.args;
  args.type = w.dtype;
  args.w = w.row(row_begin);
  args.row_bytes = w.row_bytes();
  args.cols = w.cols();
  args.n_tokens = n_tokens;
  args.x = x;
  args.y = y;
  args.ldy = ldy;
#if defined(__x86_64__)
  if (w.panels && row_begin % 16 == 0 && ActiveIsa() == Isa::kAvx512) {
    args.panel_bytes = Avx512PanelBytes(w.dtype, w.cols());
    args.panels = w.panels + row_begin / 16 * args.panel_bytes;
  }
#endif
  // Work counts (kernels/work_counter.h): the rows are read once whatever n_tokens is.
  WorkCounts& work = ThreadWork();
  work.weight_bytes += p.rows * args.row_bytes;
  (GetDTypeInfo(w.dtype).quantized ? work.ops_int8 : work.flops_f32) +=
      2 * p.rows * args.cols * n_tokens;
  return p;
}

// Rows [r0, r1) of the part (relative to its first row) for all tokens, a chunk of tokens at a
// time.
void RunPartRows(const Part& p, int64_t r0, int64_t r1) {
  const MatMulArgs& args = p.args;
  for (int64_t t0 = 0; t0 < args.n_tokens; t0 += kTokenChunk) {
    MatMulArgs c = args;
    c.n_tokens = std::min(kTokenChunk, args.n_tokens - t0);
    c.x = args.x + t0 * args.cols;
    c.a.qs = args.a.qs + t0 * args.a.qs_stride;
    c.a.d = args.a.d + t0 * args.a.d_stride;
    c.a.sums = args.a.sums + t0 * args.a.sums_stride;
    if (args.a.neg_sum) {
      c.a.neg_sum = args.a.neg_sum + t0 * args.a.d_stride;
      c.a.dsum = args.a.dsum + t0 * args.a.d_stride;
    }
    c.y = args.y + t0 * args.ldy;
    p.kernel(c, r0, r1);
  }
}

// Several tokens (a GEMM, compute bound): the threads claim chunks of kRowAlign-row units,
// in order over all parts, from a shared counter until none is left -- a thread slowed by
// anything (a neighbour on its core, a longer part) takes fewer chunks instead of making the
// others wait at the end of the region. Which thread computes a row does not change its
// result.
void RunPartsDynamic(const Part* parts, int n, ThreadPool* pool) {
  int64_t first_unit[kMaxMatMulGroup + 1];  // unit index of each part's first row
  first_unit[0] = 0;
  for (int i = 0; i < n; ++i)
    first_unit[i + 1] = first_unit[i] + (parts[i].rows + kRowAlign - 1) / kRowAlign;
  const int64_t units = first_unit[n];
  // About 8 chunks a thread: few enough that claiming costs nothing against a chunk's work,
  // enough that the last chunks even out the threads' finishing times.
  const int64_t chunk = std::max<int64_t>(1, units / (8 * int64_t{pool->num_threads()}));
  std::atomic<int64_t> next{0};
  pool->Run([&](int, int) {
    int i = 0;
    for (;;) {
      const int64_t u0 = next.fetch_add(chunk, std::memory_order_relaxed);
      if (u0 >= units) return;
      const int64_t u1 = std::min(units, u0 + chunk);
      while (first_unit[i + 1] <= u0) ++i;  // chunks are claimed in increasing order
      for (int k = i; k < n && first_unit[k] < u1; ++k) {
        const int64_t r0 = (std::max(u0, first_unit[k]) - first_unit[k]) * kRowAlign;
        const int64_t r1 = std::min(parts[k].rows, (u1 - first_unit[k]) * kRowAlign);
        if (r0 < r1) RunPartRows(parts[k], r0, r1);
      }
    }
  });
}

// Runs all rows of all parts in one parallel region. A GEMV (one token: memory bound) gives
// each thread an equal share of the weight bytes, cut at multiples of kRowAlign rows within a
// part, so every thread streams one contiguous range that may span parts; several tokens go
// through RunPartsDynamic.
void RunParts(const Part* parts, int n, ThreadPool* pool) {
  int64_t total_rows = 0, total_bytes = 0, max_tokens = 0;
  for (int i = 0; i < n; ++i) {
    total_rows += parts[i].rows;
    total_bytes += parts[i].rows * parts[i].args.row_bytes;
    max_tokens = std::max(max_tokens, parts[i].args.n_tokens);
  }
  const int nt = pool ? pool->num_threads() : 1;
  if (nt <= 1 || total_rows < 2 * kRowAlign) {
    for (int i = 0; i < n; ++i) RunPartRows(parts[i], 0, parts[i].rows);
    return;
  }
  if (max_tokens >= kDynamicTokens) {
    RunPartsDynamic(parts, n, pool);
    return;
  }
  struct Cut {
    int part;
    int64_t row;
  };
  // Cut k at byte k * total / nt, rounded to the nearest kRowAlign rows (monotonic in k).
  auto cut_at = [&](int k) {
    if (k == nt) return Cut{n - 1, parts[n - 1].rows};
    const int64_t target = total_bytes * k / nt;
    int64_t acc = 0;
    for (int i = 0; i < n; ++i) {
      const int64_t bytes = parts[i].rows * parts[i].args.row_bytes;
      if (target < acc + bytes || i == n - 1) {
        const int64_t row = (target - acc) / parts[i].args.row_bytes;
        return Cut{i, std::min(parts[i].rows, (row + kRowAlign / 2) / kRowAlign * kRowAlign)};
      }
      acc += bytes;
    }
    return Cut{n - 1, parts[n - 1].rows};
  };
  pool->Run([&](int ti, int) {
    const Cut b = cut_at(ti), e = cut_at(ti + 1);
    for (int i = b.part; i <= e.part; ++i) {
      const int64_t r0 = i == b.part ? b.row : 0;
      const int64_t r1 = i == e.part ? e.row : parts[i].rows;
      if (r0 < r1) RunPartRows(parts[i], r0, r1);
    }
  });
}

}  // namespace

void MatMulRows(const TensorView& w, int64_t row_begin, int64_t row_end, const float* x,
                int64_t n_tokens, float* y, int64_t ldy, ThreadPool* pool) {
  PENG_CHECK_MSG(MatMulSupports(w.dtype), "MatMul: unsupported weight type");
  PENG_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= w.rows());
  if (row_end == row_begin || n_tokens <= 0) return;
  PENG_CHECK(ldy >= row_end - row_begin);
  if (g_exact_activations && GetDTypeInfo(w.dtype).quantized) {
    MatMulRows(DequantizedCopy(w), row_begin, row_end, x, n_tokens, y, ldy, pool);
    return;
  }
  Part p = MakePart(w, row_begin, row_end, x, n_tokens, y, ldy);
  if (GetDTypeInfo(w.dtype).quantized)
    p.args.a = QuantizeActivations(w.dtype, x, n_tokens, p.args.cols,
                                   ResolveQuantize(ActiveIsa()), pool);
  RunParts(&p, 1, pool);
}

void MatMulGroup(const MatMulOut* outs, int n, const float* x, int64_t n_tokens,
                 ThreadPool* pool) {
  if (n <= 0 || n_tokens <= 0) return;
  PENG_CHECK(n <= kMaxMatMulGroup);
  auto x_of = [&](int i) { return outs[i].x ? outs[i].x : x; };
  bool any_quantized = false;
  for (int i = 0; i < n; ++i) {
    PENG_CHECK_MSG(MatMulSupports(outs[i].w->dtype), "MatMul: unsupported weight type");
    PENG_CHECK(x_of(i) != nullptr);
    any_quantized |= GetDTypeInfo(outs[i].w->dtype).quantized;
  }
  if (g_exact_activations && any_quantized) {
    for (int i = 0; i < n; ++i) MatMul(*outs[i].w, x_of(i), n_tokens, outs[i].y, pool);
    return;
  }
  // Per calling thread and reused: a group runs for every layer of every step, and a fresh
  // array of kMaxMatMulGroup default-initialized Parts would cost more than a small GEMV's
  // bookkeeping should.
  thread_local std::vector<Part> parts_buf;
  if (static_cast<int>(parts_buf.size()) < n) parts_buf.resize(n);
  Part* parts = parts_buf.data();
  // Quantized activations once per distinct (input, block size), all in one workspace.
  int owner[kMaxMatMulGroup];  // the part whose activations part i uses (-1: float weights)
  size_t offset[kMaxMatMulGroup], total = 0;
  for (int i = 0; i < n; ++i) {
    const TensorView& w = *outs[i].w;
    parts[i] = MakePart(w, 0, w.rows(), x_of(i), n_tokens, outs[i].y, w.rows());
    owner[i] = -1;
    if (!GetDTypeInfo(w.dtype).quantized) continue;
    owner[i] = i;
    for (int j = 0; j < i; ++j)
      if (owner[j] == j && x_of(j) == x_of(i) && outs[j].w->cols() == w.cols() &&
          ActBlockSize(outs[j].w->dtype) == ActBlockSize(w.dtype))
        owner[i] = j;
    if (owner[i] != i) continue;
    size_t bytes = 0;
    ActLayout(ActBlockSize(w.dtype), n_tokens, w.cols(), &bytes);
    offset[i] = total;
    total += bytes;
  }
  uint8_t* base = total ? ThreadWorkspace().Get(total) : nullptr;
  const QuantizeActFn quantize = ResolveQuantize(ActiveIsa());
  for (int i = 0; i < n; ++i) {
    if (owner[i] < 0) continue;
    if (owner[i] == i)
      parts[i].args.a = QuantizeActivations(outs[i].w->dtype, x_of(i), n_tokens,
                                            parts[i].args.cols, quantize, pool, base + offset[i]);
    else
      parts[i].args.a = parts[owner[i]].args.a;
  }
  RunParts(parts, n, pool);
}

void MatMul(const TensorView& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool) {
  MatMulRows(w, 0, w.rows(), x, n_tokens, y, w.rows(), pool);
}

}  // namespace peng::kernels
