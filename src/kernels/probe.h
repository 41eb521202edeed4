// The machine's peaks, measured the way the fastest kernel would reach them: read bandwidth
// with the widest loads of the active ISA on every pool thread, FP32 FMA and int8 dot-product
// throughput with enough independent chains per thread to hide their latency. These are the
// denominators of the engine's utilization gauges (engine.h EngineStats) and the bandwidth
// bound that `peng bench` reports.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace peng::kernels {

struct MachinePeaks {
  double read_bytes_per_s = 0;  // memory read bandwidth (a buffer far larger than the caches)
  double flops_f32_per_s = 0;   // FP32 fused multiply-adds, 2 FLOPs each
  double ops_int8_per_s = 0;    // int8 multiply-adds of the quantized matmuls, 2 ops each
};

// Best of `passes` reads of a `bytes` buffer (rounded down to 1 KiB), split across the pool.
double MeasureReadBandwidth(ThreadPool* pool, int64_t bytes = int64_t{512} << 20, int passes = 3);
// Best of 3 runs of about `seconds` / 3 each on every pool thread.
double MeasurePeakFlopsF32(ThreadPool* pool, double seconds = 0.06);
double MeasurePeakOpsInt8(ThreadPool* pool, double seconds = 0.06);

// All three on `pool`'s threads, measured once per process and thread count (about 0.3 s;
// later calls return the first result). Thread-safe.
MachinePeaks MeasureMachinePeaks(ThreadPool* pool);

}  // namespace peng::kernels
