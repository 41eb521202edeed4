// Subcommands of the `peng` tool. Each Register*() adds its CLI11 subcommand and the callback
// that runs it; callbacks return the process exit code through `*exit_code` (0 ok, 1 runtime
// error, 2 usage error) and print errors to stderr.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace peng::tools {

void RegisterGenerate(CLI::App& app, int* exit_code);
void RegisterTokenize(CLI::App& app, int* exit_code);
void RegisterLogits(CLI::App& app, int* exit_code);
void RegisterBench(CLI::App& app, int* exit_code);
// `peng bench serve`, a subcommand of `bench` (tools/cmd_bench_serve.cc).
CLI::App* RegisterBenchServe(CLI::App& bench, int* exit_code);
// `peng bench suite`, the monthly benchmark (tools/cmd_bench_suite.cc).
CLI::App* RegisterBenchSuite(CLI::App& bench, int* exit_code);

// The offline benchmark of `peng bench` (tools/cmd_bench.cc), also run in-process by
// `peng bench suite`: after one warm-up, `reps` times one prefill of `pp` random tokens and
// `tg` decode steps, then the machine's read bandwidth. Returns the `peng bench --json`
// document: model, threads, isa, pp / tg {n, tokens_per_s: [one per rep]},
// weight_bytes_per_token, mem_bandwidth_gbs, bandwidth_bound_tokens_per_s; on a device also
// tg.kernels_per_step and kernel_floor_us (Device::MeasureKernelFloor); with batch > 0
// also batch {n, tg, tokens_per_s, batch1_tokens_per_s}: decoding through the engine (the
// serving path) with `batch` sequences at once and, for the scaling, with one. With depth > 0
// (llama-bench's -d), every prefill and decode run follows the same context of `depth` random
// tokens, computed once before the repetitions and found in the prefix cache after that (the
// document then has "depth"); `depth` must be a multiple of the KV block size.
struct OfflineBenchOptions {
  std::string model_path;
  int threads = 0;  // 0 = physical cores
  int pp = 512;
  int tg = 128;
  int reps = 5;
  int batch = 0;    // > 0: also the engine's batched decode (tg tokens per sequence)
  int tensor_parallel_size = 1;  // > 1: under mpirun; ranks > 0 return {"worker": true}
  int pipeline_parallel_size = 1;  // > 1: under mpirun (layers split over the ranks)
  bool enable_expert_parallel = false;
  int data_parallel_size = 1;    // > 1: under mpirun (with --batch: requests spread over replicas)
  std::string device = "cpu";    // --device
  bool huge_pages = false;       // --huge-pages
  int depth = 0;                 // > 0: pp and tg run after a context of this many tokens
  DType kv_dtype = DType::kF16;  // --kv-cache-dtype
};
StatusOr<nlohmann::json> RunOfflineBench(const OfflineBenchOptions& options);
void RegisterInfo(CLI::App& app, int* exit_code);
void RegisterServe(CLI::App& app, int* exit_code);
void RegisterEval(CLI::App& app, int* exit_code);  // tools/cmd_eval.cc
void RegisterQuantize(CLI::App& app, int* exit_code);  // tools/cmd_quantize.cc
void RegisterTop(CLI::App& app, int* exit_code);       // tools/cmd_top.cc

// --device (EngineOptions::device) and --huge-pages (EngineOptions::huge_pages) on a
// subcommand.
void AddDeviceOptions(CLI::App* c, std::string* device, bool* huge_pages);
// --kv-cache-dtype f16 (default) | f32 | q8_0 (EngineOptions::kv_dtype): the KV cache's values.
void AddKvCacheDtypeOption(CLI::App* c, DType* kv_dtype);
// Prints "peng: error: <status>" to stderr and returns 1.
int Fail(const std::string& what);
// Writes `text` to `path` (replacing it); IoError naming the path when that fails.
Status WriteFile(const std::string& path, const std::string& text);

}  // namespace peng::tools
