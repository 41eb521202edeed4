// The CUDA backend's kernels over a step's logit rows (included by cuda_device.cu after
// kernels.cuh): the k best logits of each row and its first NaN / +inf (Device::TopLogits), in
// two stages -- the best k of each chunk of kTopChunk values (a block a chunk, the chunk in
// shared memory; TopChunksKernel), then the best k of the chunks' (a block a row, sorted;
// TopMergeKernel); a longer list a block a row (TopWideKernel) -- each by radix select over
// 64-bit keys that order the values as
// kernels::TopK does: the float's order key above the complement of its index, so that equal
// values rank by the lower index and no two keys are equal. And plain temperature sampling's
// draw over a row (Device::DrawTokens: DrawKernel).
#pragma once

#include <cfloat>
#include <cstdint>

#include "backend/cuda/kernels.cuh"

namespace peng::backend::cuda {
namespace {

constexpr int kTopThreads = 512;    // threads of both stages' blocks
constexpr int kTopChunk = 8192;     // values a first-stage block
constexpr int kTopMax = 256;        // k at most in a step (Device::kTopLogitsMax)
constexpr int kTopWide = 4096;      // k at most (Device::kTopLogitsWide: TopWideKernel)
constexpr int kNoBad = 0x7fffffff;  // (no NaN / +inf seen)

// A float's bits as a key that orders as the value: -0.0 as +0.0, NaN below -inf.
__device__ __forceinline__ uint32_t LogitOrderKey(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0;  // NaN
  if (u == 0x80000000u) u = 0;                     // -0.0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ bool NanOrPosInf(uint32_t u) {
  return u != 0xff800000u && (u & 0x7fffffffu) >= 0x7f800000u;
}
// Value i of a row, as a selection key: larger is better; 0 is below every value (padding).
__device__ __forceinline__ uint64_t TopKey(uint32_t bits, int64_t i) {
  return uint64_t{LogitOrderKey(bits)} << 32 | (0xffffffffu - static_cast<uint32_t>(i));
}
__device__ __forceinline__ int32_t TopKeyIndex(uint64_t key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key));
}

// A block's shared state during a selection.
struct TopSelect {
  uint32_t hist[256];
  uint64_t warp_best[kTopThreads / kWarp];  // (k = 1)
  uint64_t prefix;  // the top bits the selection's last keys share, found so far
  uint32_t need;    // keys with that prefix still to select
  bool done;        // every key with the prefix is selected
  int taken;
};

// The k largest of the n distinct keys key(i) (k <= n) into out[0, k), unordered, by radix
// select from the top byte down: each pass counts the keys that share the prefix found so far
// by their next byte; it ends where a byte's keys are exactly the ones still needed (k = 1:
// the maximum). Every thread of the block calls it (blockDim.x a multiple of 32, at most
// kTopThreads); out is complete when it returns.
template <typename KeyOf>
__device__ void SelectTop(KeyOf key, int n, int k, uint64_t* out, TopSelect& s) {
  const int tid = threadIdx.x;
  if (k == 1) {  // (greedy) the largest key: a block-wide maximum, one pass
    uint64_t best = 0;
    for (int i = tid; i < n; i += blockDim.x) best = best > key(i) ? best : key(i);
    best = WarpButterfly(best, MaxOp{});
    if (tid % kWarp == 0) s.warp_best[tid / kWarp] = best;
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < static_cast<int>(blockDim.x) / kWarp; ++w)
        best = best > s.warp_best[w] ? best : s.warp_best[w];
      out[0] = best;
    }
    __syncthreads();
    return;
  }
  // (Every lane of a warp runs the loops below as often as the others -- to n rounded up to
  // the block -- for the warp's votes: the lanes that count one byte add once, and those that
  // take a key take their places at once. Most keys of a row share its first bytes, and a
  // shared atomic's lanes on one address take turns.)
  const int lane = tid % kWarp, rounded = (n + blockDim.x - 1) / blockDim.x * blockDim.x;
  uint64_t prefix = 0, mask = 0;
  uint32_t need = static_cast<uint32_t>(k);
  for (int shift = 56;; shift -= 8) {
    for (int b = tid; b < 256; b += blockDim.x) s.hist[b] = 0;
    __syncthreads();
    for (int i = tid; i < rounded; i += blockDim.x) {
      int byte = -1;
      if (i < n) {
        const uint64_t c = key(i);
        if ((c & mask) == prefix) byte = static_cast<int>((c >> shift) & 255);
      }
      const unsigned same = __match_any_sync(0xffffffffu, byte);
      if (byte >= 0 && __ffs(static_cast<int>(same)) - 1 == lane)
        atomicAdd(&s.hist[byte], static_cast<uint32_t>(__popc(same)));
    }
    __syncthreads();
    if (tid < kWarp) {  // the byte where the count from the top reaches `need`: 8 bins a lane
      const int lane = tid;
      uint32_t c[8], sum = 0;
      for (int j = 0; j < 8; ++j) sum += c[j] = s.hist[255 - 8 * lane - j];
      uint32_t incl = sum;
      for (int d = 1; d < kWarp; d *= 2) {
        const uint32_t o = __shfl_sync(0xffffffffu, incl, lane >= d ? lane - d : lane);
        if (lane >= d) incl += o;
      }
      const uint32_t excl = incl - sum;
      if (excl < need && need <= incl) {
        uint32_t above = excl, cj = 0;
        int j = 8;
#pragma unroll
        for (int q = 0; q < 8; ++q) {  // (unrolled: c stays in registers)
          if (j < 8) continue;
          if (above + c[q] < need) {
            above += c[q];
          } else {
            j = q;
            cj = c[q];
          }
        }
        s.prefix = prefix | uint64_t{255u - 8u * lane - j} << shift;
        s.need = need - above;
        s.done = cj == need - above;
        s.taken = 0;
      }
    }
    __syncthreads();
    prefix = s.prefix;
    need = s.need;
    mask |= uint64_t{255} << shift;
    if (s.done || shift == 0) break;  // (the keys are distinct: done at the last byte)
  }
  // The keys above the prefix and those that share it: k in all.
  for (int i = tid; i < rounded; i += blockDim.x) {
    const uint64_t c = i < n ? key(i) : 0;
    const bool take = i < n && (c & mask) >= prefix;
    const unsigned taking = __ballot_sync(0xffffffffu, take);
    int at = 0;
    if (lane == 0 && taking != 0) at = atomicAdd(&s.taken, __popc(taking));
    at = __shfl_sync(0xffffffffu, at, 0);
    if (take) out[at + __popc(taking & ((1u << lane) - 1u))] = c;
  }
  __syncthreads();
}

// Grid (chunks, rows): the best k of the chunk's values, as keys, into keys[(row chunks +
// chunk) k ...] (padded with 0 past a chunk of fewer than k values), and the chunk's first NaN /
// +inf index in the row into bad[row chunks + chunk] (-1: none).
__global__ void __launch_bounds__(kTopThreads)
    TopChunksKernel(const float* x, int64_t n, int k, uint64_t* keys, int32_t* bad) {
  KernelStart();
  __shared__ uint32_t vals[kTopChunk];
  __shared__ TopSelect s;
  __shared__ int s_bad;
  const int64_t row = blockIdx.y, chunk = row * gridDim.x + blockIdx.x;
  const int64_t c0 = int64_t{blockIdx.x} * kTopChunk;
  const int m = static_cast<int>(n - c0 < kTopChunk ? n - c0 : kTopChunk);
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(x + row * n) + c0;
  if (threadIdx.x == 0) s_bad = kNoBad;
  __syncthreads();
  int my_bad = kNoBad;
  for (int i = threadIdx.x; i < m; i += blockDim.x) {
    const uint32_t u = bits[i];
    vals[i] = u;
    if (my_bad == kNoBad && NanOrPosInf(u)) my_bad = i;  // (a thread's first is its lowest)
  }
  if (my_bad != kNoBad) atomicMin(&s_bad, my_bad);
  __syncthreads();
  if (threadIdx.x == 0) bad[chunk] = s_bad == kNoBad ? -1 : static_cast<int32_t>(c0 + s_bad);
  uint64_t* out = keys + chunk * k;
  if (m <= k) {
    for (int i = threadIdx.x; i < k; i += blockDim.x) out[i] = i < m ? TopKey(vals[i], c0 + i) : 0;
    return;
  }
  SelectTop([&](int i) { return TopKey(vals[i], c0 + i); }, m, k, out, s);
}

// A block a row: the best k of its chunks' keys, sorted best first, into val / idx [row k ...]
// (the values read back from x), and the row's first NaN / +inf into first_bad[row].
__global__ void __launch_bounds__(kTopThreads)
    TopMergeKernel(const float* x, int64_t n, int chunks, int k, const uint64_t* keys,
                   const int32_t* bad, float* val, int32_t* idx, int32_t* first_bad) {
  KernelStart();
  __shared__ TopSelect s;
  __shared__ uint64_t top[kTopMax];
  const int64_t row = blockIdx.x;
  const uint64_t* rk = keys + row * chunks * k;
  if (threadIdx.x == 0) {
    int32_t b = -1;
    for (int c = 0; c < chunks && b < 0; ++c) b = bad[row * chunks + c];
    first_bad[row] = b;
  }
  if (chunks == 1) {
    for (int i = threadIdx.x; i < k; i += blockDim.x) top[i] = rk[i];
    __syncthreads();
  } else {
    SelectTop([&](int i) { return rk[i]; }, chunks * k, k, top, s);
  }
  if (static_cast<int>(threadIdx.x) < k) {  // its rank: the keys above it
    const uint64_t c = top[threadIdx.x];
    int rank = 0;
    for (int j = 0; j < k; ++j) rank += top[j] > c;
    const int32_t i = TopKeyIndex(c);
    idx[row * k + rank] = i;
    val[row * k + rank] = x[row * n + i];
  }
}

// A block a row, for k > kTopMax (up to kTopWide: a few rows whose nucleus reaches past their
// best kTopMax, Device::TopLogits after a step): the best k of the row by SelectTop over the
// row itself (its keys into keys[row k ...]), sorted best first in shared memory (a bitonic
// sort over the next power of two, padded with 0 keys), into val / idx [row k ...]; the row's
// first NaN / +inf into first_bad[row].
__global__ void __launch_bounds__(kTopThreads)
    TopWideKernel(const float* x, int64_t n, int k, uint64_t* keys, float* val, int32_t* idx,
                  int32_t* first_bad) {
  KernelStart();
  __shared__ TopSelect s;
  __shared__ uint64_t sorted[kTopWide];
  __shared__ int s_bad;
  const int64_t row = blockIdx.x;
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(x + row * n);
  const int tid = threadIdx.x, m = static_cast<int>(n);
  if (tid == 0) s_bad = kNoBad;
  __syncthreads();
  int my_bad = kNoBad;
  for (int i = tid; i < m && my_bad == kNoBad; i += blockDim.x)
    if (NanOrPosInf(bits[i])) my_bad = i;  // (a thread's first is its lowest)
  if (my_bad != kNoBad) atomicMin(&s_bad, my_bad);
  uint64_t* out = keys + row * k;
  SelectTop([&](int i) { return TopKey(bits[i], i); }, m, k, out, s);  // (barriers: s_bad set)
  if (tid == 0) first_bad[row] = s_bad == kNoBad ? -1 : s_bad;
  int p = 1;
  while (p < k) p *= 2;
  for (int i = tid; i < p; i += blockDim.x) sorted[i] = i < k ? out[i] : 0;
  __syncthreads();
  for (int size = 2; size <= p; size *= 2)  // (the last merge, size p, is descending)
    for (int stride = size / 2; stride > 0; stride /= 2) {
      for (int i = tid; i < p; i += blockDim.x) {
        const int j = i ^ stride;
        if (j <= i) continue;
        const uint64_t a = sorted[i], b = sorted[j];
        if ((i & size) == 0 ? a < b : a > b) {
          sorted[i] = b;
          sorted[j] = a;
        }
      }
      __syncthreads();
    }
  for (int i = tid; i < k; i += blockDim.x) {
    const int32_t at = TopKeyIndex(sorted[i]);
    idx[row * k + i] = at;
    val[row * k + i] = x[row * n + at];
  }
}

// A block a row (Device::EditLogits): thread 0 adds the biases in their order (an id may come
// twice), then the threads set what the mask does not allow and the bans to -inf and apply the
// penalties (the history's ids are distinct) -- each operation rounded on its own (no
// multiply-add fused), so that the values are kernels::PenalizedLogit's.
__global__ void EditLogitsKernel(float* x, int64_t n, const Device::LogitEditRow* rows,
                                 const Device::LogitEdit* edits, const uint32_t* masks) {
  KernelStart();
  const Device::LogitEditRow e = rows[blockIdx.x];
  float* row = x + int64_t{blockIdx.x} * n;
  const auto in_row = [n](int32_t id) { return id >= 0 && id < n; };
  if (threadIdx.x == 0)
    for (int32_t i = e.bias; i < e.ban; ++i)
      if (in_row(edits[i].id)) row[edits[i].id] = __fadd_rn(row[edits[i].id], edits[i].value);
  __syncthreads();
  if (e.mask >= 0) {
    const uint32_t* m = masks + e.mask;
    for (int64_t id = threadIdx.x; id < n; id += blockDim.x)
      if (!(m[id / 32] >> (id % 32) & 1u)) row[id] = -INFINITY;
  }
  for (int32_t i = e.ban + threadIdx.x; i < e.history; i += blockDim.x)
    if (in_row(edits[i].id)) row[edits[i].id] = -INFINITY;
  __syncthreads();
  for (int32_t i = e.history + threadIdx.x; i < e.end; i += blockDim.x) {
    if (!in_row(edits[i].id)) continue;
    float l = row[edits[i].id];
    if (e.repetition != 1.0f)
      l = l > 0.0f ? __fdiv_rn(l, e.repetition) : __fmul_rn(l, e.repetition);
    const float count = edits[i].value;
    if (count > 0.0f) l = __fsub_rn(l, __fadd_rn(e.presence, __fmul_rn(e.frequency, count)));
    row[edits[i].id] = FLT_MAX < l ? FLT_MAX : l;
  }
}

constexpr int kDrawThreads = 1024;

// Value x's weight in a draw (kernels::DrawInIdOrder's: a float exp, summed in double).
__device__ __forceinline__ double DrawWeight(float x, float m, float inv_t) {
  return static_cast<double>(expf((x - m) * inv_t));
}

// A block a row (Device::DrawTokens): warp w sums the weights of segment w of the row (`seg`
// values, a multiple of 32; its lanes read 32 values at a time) -- and the log-softmax's terms
// where asked --, thread 0 adds the segments' sums up (the totals) and finds the segment in
// which the running sum passes u * total, and that segment's warp walks it 32 values at a time
// (a lane a value, their running sum a scan over the lanes) to the first value where it does.
// Where rounding leaves the sum short of u * total: the last value of positive weight, of the
// row (kernels::DrawInIdOrder) or, on the walk, of the segment.
__global__ void __launch_bounds__(kDrawThreads)
    DrawKernel(const float* x, int64_t n, const float* best, int best_stride,
               const Device::TokenDraw* draws, Device::DrawResults out) {
  KernelStart();
  constexpr int kWarps = kDrawThreads / kWarp;
  __shared__ double seg_sum[kWarps];
  __shared__ int seg_last[kWarps];
  __shared__ int s_warp;  // the segment the draw lands in; -1: none (drawn[row] written)
  __shared__ double s_base, s_target;
  const int64_t row = blockIdx.x;
  const Device::TokenDraw d = draws[row];
  const float m = best[row * best_stride];
  const bool finite = m > -INFINITY && m < INFINITY;
  const bool sums = finite && d.inv_temperature > 0.f;
  const bool draw = sums && d.uniform >= 0.0;
  const bool log_sum = finite && (d.flags & Device::kLogSoftmaxTotal) != 0;
  if (threadIdx.x == 0) {
    out.drawn[row] = -1;
    out.drawn_logit[row] = 0.f;
    out.total[row] = 0.0;
    out.log_total[row] = 0.0;
  }
  if (!sums && !log_sum) return;
  const float inv_t = d.inv_temperature;
  const float* xr = x + row * n;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t seg = (n + kDrawThreads - 1) / kDrawThreads * kWarp;
  const int64_t lo = warp * seg < n ? warp * seg : n, hi = lo + seg < n ? lo + seg : n;
  double sum = 0.0, lsum = 0.0;
  int last = -1;
  for (int64_t i = lo + lane; i < hi; i += kWarp) {
    if (sums) {
      const double w = DrawWeight(xr[i], m, inv_t);
      sum += w;
      if (w > 0.0) last = static_cast<int>(i);
    }
    if (log_sum) lsum += exp(static_cast<double>(xr[i] - m));  // (kernels::LogSoftmaxTotal's)
  }
  sum = WarpButterfly(sum, AddOp{});
  last = WarpButterfly(last, MaxOp{});
  if (log_sum) lsum = WarpButterfly(lsum, AddOp{});
  __shared__ double seg_lsum[kWarps];
  if (lane == 0) {
    seg_sum[warp] = sum;
    seg_last[warp] = last;
    seg_lsum[warp] = lsum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0, ltotal = 0.0;
    for (int w = 0; w < kWarps; ++w) {
      total += seg_sum[w];
      ltotal += seg_lsum[w];
    }
    out.total[row] = total;
    out.log_total[row] = ltotal;
    const double target = d.uniform * total;
    double acc = 0.0;
    int found = -1;
    for (int w = 0; w < kWarps && found < 0 && draw; ++w) {
      if (seg_sum[w] > 0.0 && target < acc + seg_sum[w]) {
        found = w;
      } else {
        acc += seg_sum[w];
      }
    }
    s_warp = found;
    s_base = acc;
    s_target = target;
    if (found < 0 && draw) {
      int l = -1;
      for (int w = 0; w < kWarps; ++w) l = l > seg_last[w] ? l : seg_last[w];
      out.drawn[row] = l;
      out.drawn_logit[row] = xr[l];
    }
  }
  __syncthreads();
  if (warp != s_warp) return;
  const double target = s_target;
  double base = s_base;
  for (int64_t i0 = lo; i0 < hi; i0 += kWarp) {
    const int64_t i = i0 + lane;
    const double w = i < hi ? DrawWeight(xr[i], m, inv_t) : 0.0;
    double incl = w;
    for (int o = 1; o < kWarp; o *= 2) {
      const double v = __shfl_sync(0xffffffffu, incl, lane >= o ? lane - o : lane);
      if (lane >= o) incl += v;
    }
    const int first = WarpButterfly(w > 0.0 && target < base + incl ? lane : kWarp, MinOp{});
    if (first < kWarp) {
      if (lane == first) {
        out.drawn[row] = static_cast<int32_t>(i);
        out.drawn_logit[row] = xr[i];
      }
      return;
    }
    base += __shfl_sync(0xffffffffu, incl, kWarp - 1);
  }
  if (lane == 0) {
    out.drawn[row] = seg_last[warp];
    out.drawn_logit[row] = xr[seg_last[warp]];
  }
}

}  // namespace
}  // namespace peng::backend::cuda
