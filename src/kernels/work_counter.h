// The work the kernels did, counted by the ops themselves: bytes read from memory (a weight
// matrix once per call, a sequence's KV cache once per layer) and arithmetic (2 per
// multiply-add), split by the precision of the multiply: FP32 FMAs (F32/F16/BF16 weights,
// attention) and int8 dot products (block-quantized and INT8 weights). The engine turns them
// into its utilization gauges (achieved bandwidth and FLOP/s against kernels/probe.h's peaks).
//
// Each op adds its totals once per call on the thread that called it, not on its pool workers,
// so the counts are thread_local: an engine thread that reads its own counts around a step
// gets exactly that step's work, whatever other engines in the process do. No atomics.
#pragma once

#include <cstdint>

namespace peng::kernels {

struct WorkCounts {
  int64_t weight_bytes = 0;  // weight matrices read
  int64_t kv_bytes = 0;      // KV cache read by attention
  int64_t flops_f32 = 0;
  int64_t ops_int8 = 0;

  WorkCounts operator-(const WorkCounts& o) const {
    return {weight_bytes - o.weight_bytes, kv_bytes - o.kv_bytes, flops_f32 - o.flops_f32,
            ops_int8 - o.ops_int8};
  }
  WorkCounts& operator+=(const WorkCounts& o) {
    weight_bytes += o.weight_bytes;
    kv_bytes += o.kv_bytes;
    flops_f32 += o.flops_f32;
    ops_int8 += o.ops_int8;
    return *this;
  }
};

// This thread's running totals (monotonic; never reset).
inline WorkCounts& ThreadWork() {
  thread_local WorkCounts counts;
  return counts;
}

// For ops called inside pool tasks (whose counts land on the workers' threads): created at the
// start of a task, Take() returns what the task counted on this thread and removes it there, so
// the caller can add the tasks' counts to its own thread's.
class WorkCapture {
 public:
  WorkCapture() : before_(ThreadWork()) {}
  WorkCounts Take() {
    const WorkCounts d = ThreadWork() - before_;
    ThreadWork() = before_;
    return d;
  }

 private:
  WorkCounts before_;
};

// Causal attention of n_q queries at positions pos0 .. pos0 + n_q - 1 over one sequence's
// cache: each query sees the keys at positions <= its own (only the last `window` of them when
// window > 0). Adds the cache bytes (every visible position read once, `kv_row_bytes` each) and
// flops_per_key FP32 FLOPs per (query, visible key) pair.
inline void CountAttentionWork(int64_t n_q, int64_t pos0, int64_t window, int64_t kv_row_bytes,
                               int64_t flops_per_key) {
  int64_t pairs = 0;
  if (window <= 0) {
    pairs = n_q * pos0 + n_q * (n_q + 1) / 2;
  } else {
    for (int64_t t = 0; t < n_q; ++t) pairs += pos0 + t + 1 < window ? pos0 + t + 1 : window;
  }
  const int64_t first = window > 0 && pos0 + 1 > window ? pos0 + 1 - window : 0;
  WorkCounts& w = ThreadWork();
  w.kv_bytes += (pos0 + n_q - first) * kv_row_bytes;
  w.flops_f32 += pairs * flops_per_key;
}

}  // namespace peng::kernels
