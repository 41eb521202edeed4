// peng bench: prompt-processing and generation speed, like llama-bench (pp N: one prefill of N
// tokens; tg N: N single-token decode steps; both from an empty context, or after --depth D
// tokens of context, `pp N @ dD` as llama-bench -d writes it), repeated --reps times,
// plus the machine's memory read bandwidth (measured with the widest loads the active ISA has,
// on every thread) and the bandwidth bound of decoding (weight bytes read per token /
// bandwidth).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/device.h"
#include "core/status.h"
#include "engine/engine.h"
#include "engine/engine_core.h"
#include "engine/llm.h"
#include "kernels/isa.h"
#include "kernels/probe.h"
#include "tools/commands.h"

namespace peng::tools {
namespace {

struct BenchArgs {
  OfflineBenchOptions bench;
  bool json = false;
};

struct Stats {
  double median, min, max;
};
Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  const double med = v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
  return {med, v.front(), v.back()};
}

// Decode rate of the engine (the serving path) with `batch` sequences decoding together:
// `batch` requests of 16 random prompt tokens and `tg` output tokens (greedy, ignore_eos) are
// submitted at once; the clock runs from every sequence's first token (all prompts are
// prefilled in one step) to the last token, so only decode steps count:
// batch x (tg - 1) tokens. One warm-up, then `reps` runs; tokens/s of each run.
StatusOr<std::vector<double>> BenchBatchedDecode(Engine* engine, int batch, int tg, int reps,
                                                 int64_t vocab) {
  using Clock = std::chrono::steady_clock;
  constexpr int kPromptLen = 16;
  std::mt19937 rng(99);
  std::vector<double> out;
  for (int r = -1; r < reps; ++r) {  // r = -1: warm-up
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < batch; ++i) {
      GenerateRequest req;
      req.id = "bench-" + std::to_string(r) + "-" + std::to_string(i);
      for (int k = 0; k < kPromptLen; ++k) req.prompt.push_back(static_cast<int32_t>(rng() % vocab));
      req.params.temperature = 0;
      req.params.max_tokens = tg;
      req.params.ignore_eos = true;
      auto s = engine->Submit(std::move(req));
      if (!s.ok()) return s.status();
      streams.push_back(*s);
    }
    // Events wait in their streams, so reading the streams one after the other misses no
    // time: every stream's first event (its first token, from the one prefill step) starts
    // the clock, the end of the last stream stops it.
    auto read = [](RequestStream* st, RequestOutput* ev) -> StatusOr<bool> {
      bool timed_out = false;
      *ev = RequestOutput();
      const bool more = st->Next(ev, std::chrono::minutes(30), &timed_out);
      if (timed_out) return Internal("batched decode: no token in 30 min");
      if (more && ev->finish_reason && *ev->finish_reason != "length")
        return Internal("batched decode: a request ended with " + *ev->finish_reason);
      return more;
    };
    RequestOutput ev;
    for (auto& st : streams) {
      PENG_ASSIGN_OR_RETURN(const bool more, read(st.get(), &ev));
      if (!more) return Internal("batched decode: a request ended before its first token");
    }
    const auto t0 = Clock::now();
    for (auto& st : streams) {
      for (;;) {
        PENG_ASSIGN_OR_RETURN(const bool more, read(st.get(), &ev));
        if (!more) break;
      }
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r >= 0) out.push_back(static_cast<double>(batch) * (tg - 1) / s);
  }
  return out;
}

}  // namespace

StatusOr<nlohmann::json> RunOfflineBench(const OfflineBenchOptions& a) {
  LlmOptions o;
  o.model_path = a.model_path;
  o.threads = a.threads;
  o.device = a.device;
  o.max_model_len = std::max<int64_t>(o.max_model_len, int64_t{a.depth} + a.pp + a.tg + 1);
  o.max_num_batched_tokens = std::max<int64_t>(o.max_num_batched_tokens, a.pp);
  o.tensor_parallel_size = a.tensor_parallel_size;
  o.pipeline_parallel_size = a.pipeline_parallel_size;
  o.enable_expert_parallel = a.enable_expert_parallel;
  o.data_parallel_size = a.data_parallel_size;
  o.huge_pages = a.huge_pages;
  o.kv_dtype = a.kv_dtype;
  // --depth: the context is computed once; later runs find it in the prefix cache, whole
  // blocks only, so only a depth of whole blocks leaves exactly the test's tokens to compute.
  o.enable_prefix_caching = a.depth > 0;
  if (a.depth < 0) return InvalidArgument("--depth must be >= 0");
  if (a.depth % o.block_size != 0)
    return InvalidArgument("--depth " + std::to_string(a.depth) +
                           " is not a multiple of the KV block size " +
                           std::to_string(o.block_size));
  if (a.depth > 0 && a.batch > 0)
    return InvalidArgument("--depth times the pp and tg tests only, not --batch");
  EngineOptions eo;  // --batch: the serving engine
  eo.model_path = a.model_path;
  eo.threads = a.threads;
  eo.device = a.device;
  eo.max_num_seqs = std::max(1, a.batch);
  eo.max_model_len = 16 + a.tg + 1;
  eo.max_num_batched_tokens = std::max<int64_t>(512, int64_t{16} * a.batch);
  eo.max_waiting = std::max(256, a.batch);
  eo.measure_peaks = false;
  eo.tensor_parallel_size = a.tensor_parallel_size;
  eo.pipeline_parallel_size = a.pipeline_parallel_size;
  eo.enable_expert_parallel = a.enable_expert_parallel;
  eo.data_parallel_size = a.data_parallel_size;
  eo.huge_pages = a.huge_pages;
  eo.kv_dtype = a.kv_dtype;
  const bool batched = a.batch > 0 && a.tg > 1;
  // Tensor-parallel ranks > 0 serve rank 0's engine cores (Llm's, then the batched engine's).
  PENG_ASSIGN_OR_RETURN(const bool worker, RunParallelWorker(Llm::CoreOptions(o)));
  if (worker) return nlohmann::json{{"worker", true}};
  auto llm = Llm::Load(o);
  if (!llm.ok()) return llm.status();
  Llm& m = **llm;
  if (a.depth + a.pp + 1 > m.max_model_len() || a.depth + a.tg + 1 > m.max_model_len())
    return InvalidArgument("--depth + --pp/--tg exceed the model's context length (" +
                           std::to_string(m.max_model_len()) + ")");
  std::mt19937 rng(1234);
  const int64_t V = m.model().config().vocab_size;
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % V);
    return t;
  };
  const std::vector<int32_t> context = random_tokens(a.depth);
  std::vector<int32_t> prompt = random_tokens(a.pp);
  // Warm-up: touches all weights once.
  if (auto w = m.BenchDecode(2); !w.ok()) return w.status();
  if (a.depth > 0) {  // the context, into the prefix cache
    if (auto w = m.BenchPrefill(context); !w.ok()) return w.status();
  }
  std::vector<double> pp_tps, tg_tps;
  int64_t tg_kernels = 0;  // kernels the decode steps launched on a device
  for (int r = 0; r < a.reps; ++r) {
    if (a.pp > 0) {
      // After a context each run's tokens are new ones (the last run's are cached too).
      if (a.depth > 0 && r > 0) prompt = random_tokens(a.pp);
      std::vector<int32_t> tokens = context;
      tokens.insert(tokens.end(), prompt.begin(), prompt.end());
      int64_t computed = 0;
      auto s = m.BenchPrefill(tokens, &computed);
      if (!s.ok()) return s.status();
      if (computed != a.pp)
        return Internal("pp after --depth computed " + std::to_string(computed) +
                        " tokens, not " + std::to_string(a.pp) +
                        ": the context was not in the prefix cache");
      pp_tps.push_back(a.pp / *s);
    }
    if (a.tg > 0) {
      const int64_t k0 = m.DeviceKernelLaunches();
      auto s = m.BenchDecode(a.tg, context);
      if (!s.ok()) return s.status();
      tg_tps.push_back(a.tg / *s);
      tg_kernels += m.DeviceKernelLaunches() - k0;
    }
  }
  // The widest loads of the active ISA on every thread, 1 GiB, best of 3 (kernels/probe.h); on
  // a device its own memory's, by its own probe.
  double bw = 0, kernel_floor = 0;
  std::string device_name = "cpu";
  if (a.device == "cpu") {
    bw = kernels::MeasureReadBandwidth(&m.pool(), int64_t{1} << 30, 3) / 1e9;
  } else {
    auto dev = backend::CreateDevice(a.device, &m.pool());
    if (!dev.ok()) return dev.status();
    bw = (*dev)->MeasureReadBandwidth(int64_t{1} << 30) / 1e9;
    kernel_floor = (*dev)->MeasureKernelFloor();
    device_name = (*dev)->Name();
  }
  const WeightTraffic traffic = m.model().WeightsPerToken();
  const int64_t bytes = traffic.bytes;
  nlohmann::json j;
  j["model"] = a.model_path;
  j["threads"] = m.pool().num_threads();
  j["isa"] = kernels::IsaName(kernels::ActiveIsa());
  j["device"] = device_name;
  if (a.depth > 0) j["depth"] = a.depth;
  j["kv_cache_dtype"] = KvCacheDtypeName(a.kv_dtype);
  j["pp"] = {{"n", a.pp}, {"tokens_per_s", pp_tps}};
  j["tg"] = {{"n", a.tg}, {"tokens_per_s", tg_tps}};
  // (a run is tg + 1 steps: tg decode steps after the prompt's step, which has one token, or
  // after --depth the context's last block)
  if (tg_kernels > 0)
    j["tg"]["kernels_per_step"] = static_cast<double>(tg_kernels) / ((a.tg + 1) * a.reps);
  if (kernel_floor > 0) j["kernel_floor_us"] = kernel_floor * 1e6;
  j["weight_bytes_per_token"] = bytes;
  j["mem_bandwidth_gbs"] = bw;
  j["bandwidth_bound_tokens_per_s"] = bw * 1e9 / bytes;
  j["tensor_parallel_size"] = a.tensor_parallel_size;
  j["pipeline_parallel_size"] = a.pipeline_parallel_size;
  j["enable_expert_parallel"] = a.enable_expert_parallel;
  j["data_parallel_size"] = a.data_parallel_size;
  if (batched && a.device == "cpu") {
    // The compute bound of a batch: every token's multiply-adds with the weights at the
    // machine's int8 dot-product / FP32 FMA peaks (2 ops a multiply-add), nothing else.
    const double int8_ops = kernels::MeasurePeakOpsInt8(&m.pool());
    const double f32_flops = kernels::MeasurePeakFlopsF32(&m.pool());
    const double s = 2.0 * traffic.int_multiply_adds / int8_ops +
                     2.0 * traffic.float_multiply_adds / f32_flops;
    j["int8_peak_gops"] = int8_ops / 1e9;
    j["f32_peak_gflops"] = f32_flops / 1e9;
    j["weight_multiply_adds_per_token"] = {{"int", traffic.int_multiply_adds},
                                           {"float", traffic.float_multiply_adds}};
    j["compute_bound_tokens_per_s"] = 1.0 / s;
  }
  if (batched) {
    llm->reset();  // one copy of the weights at a time
    auto engine = Engine::Create(eo);
    if (!engine.ok()) return engine.status();
    const int64_t vocab = (*engine)->model_config().vocab_size;
    auto batched = BenchBatchedDecode(engine->get(), a.batch, a.tg, a.reps, vocab);
    if (!batched.ok()) return batched.status();
    auto single = BenchBatchedDecode(engine->get(), 1, a.tg, a.reps, vocab);
    if (!single.ok()) return single.status();
    j["batch"] = {{"n", a.batch},
                  {"tg", a.tg},
                  {"tokens_per_s", *batched},
                  {"batch1_tokens_per_s", *single}};
  }
  return j;
}

namespace {

int RunBench(const BenchArgs& a) {
  StatusOr<nlohmann::json> r = RunOfflineBench(a.bench);
  if (!r.ok()) return Fail(r.status().ToString());
  const nlohmann::json& j = *r;
  if (j.contains("worker")) return 0;  // a tensor-parallel rank > 0: rank 0 reports
  if (a.json) {
    std::puts(j.dump(2).c_str());
    return 0;
  }
  const std::vector<double> pp_tps = j["pp"]["tokens_per_s"], tg_tps = j["tg"]["tokens_per_s"];
  const double bw = j["mem_bandwidth_gbs"];
  const int64_t bytes = j["weight_bytes_per_token"];
  std::printf("model: %s\nthreads: %d  isa: %s  device: %s  kv cache: %s\n",
              a.bench.model_path.c_str(), j["threads"].get<int>(),
              j["isa"].get<std::string>().c_str(), j["device"].get<std::string>().c_str(),
              j["kv_cache_dtype"].get<std::string>().c_str());
  // llama-bench's names: pp512, tg128, and "pp512 @ d4096" after a context.
  const std::string at = a.bench.depth > 0 ? " @ d" + std::to_string(a.bench.depth) : "";
  auto row = [&](const char* test, int n, const std::vector<double>& tps) {
    if (tps.empty()) return;
    const Stats s = Summarize(tps);
    const std::string name = test + std::to_string(n) + at;
    std::printf("%-*s %10.1f %10.1f %10.1f  tokens/s\n", static_cast<int>(at.size()) + 8,
                name.c_str(), s.median, s.min, s.max);
  };
  std::printf("%-*s %10s %10s %10s\n", static_cast<int>(at.size()) + 8, "test", "median", "min",
              "max");
  row("pp", a.bench.pp, pp_tps);
  row("tg", a.bench.tg, tg_tps);
  std::printf("weights read per token: %.1f MB; read bandwidth: %.1f GB/s; bound: %.1f tok/s\n",
              bytes / 1e6, bw, bw * 1e9 / bytes);
  if (j["tg"].contains("kernels_per_step") && j.contains("kernel_floor_us") && !tg_tps.empty()) {
    // What the kernels of a decode step cost before they read anything.
    const double k = j["tg"]["kernels_per_step"], floor = j["kernel_floor_us"];
    std::printf("decode step: %.0f kernels x %.2f us (an empty kernel) = %.0f us of its %.0f us\n",
                k, floor, k * floor, 1e6 / Summarize(tg_tps).median);
  }
  if (j.contains("batch")) {
    const Stats b = Summarize(j["batch"]["tokens_per_s"].get<std::vector<double>>());
    const Stats one = Summarize(j["batch"]["batch1_tokens_per_s"].get<std::vector<double>>());
    std::printf("engine decode, %d sequences: %.1f tokens/s (%.1f per sequence); 1 sequence: "
                "%.1f tokens/s; scaling %.2fx (medians)\n",
                a.bench.batch, b.median, b.median / a.bench.batch, one.median,
                b.median / one.median);
    if (j.contains("compute_bound_tokens_per_s")) {
      // Over the bandwidth bound of one sequence: the most a batch can scale while one
      // sequence decodes at the read bandwidth (the batch's step at the machine's peaks).
      const double bound = j["compute_bound_tokens_per_s"];
      std::printf("compute bound of a batch (%.1f M integer + %.1f M float multiply-adds a token "
                  "at %.0f int8 GOP/s, %.0f FP32 GFLOP/s): %.1f tokens/s = %.2fx the 1-sequence "
                  "rate, %.2fx the bandwidth bound of one sequence\n",
                  j["weight_multiply_adds_per_token"]["int"].get<int64_t>() / 1e6,
                  j["weight_multiply_adds_per_token"]["float"].get<int64_t>() / 1e6,
                  j["int8_peak_gops"].get<double>(), j["f32_peak_gflops"].get<double>(), bound,
                  bound / one.median, bound / j["bandwidth_bound_tokens_per_s"].get<double>());
    }
  }
  return 0;
}

}  // namespace

void RegisterBench(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* c = app.add_subcommand("bench", "Prompt-processing and generation speed");
  // Required unless the `serve` or `suite` subcommand is given (checked in the callback).
  c->add_option("-m,--model", a->bench.model_path, "GGUF file or Hugging Face model folder");
  c->add_option("--pp", a->bench.pp, "Prompt tokens per prefill test (0 = skip)")
      ->check(CLI::Range(0, 1 << 20));
  c->add_option("--tg", a->bench.tg, "Generated tokens per decode test (0 = skip)")
      ->check(CLI::Range(0, 1 << 20));
  c->add_option("--reps", a->bench.reps, "Repetitions")->check(CLI::Range(1, 1000));
  c->add_option("-d,--depth", a->bench.depth,
                "Run pp and tg after a context of this many tokens (a multiple of the KV block "
                "size, 16; computed once, then found in the prefix cache), as llama-bench -d")
      ->check(CLI::Range(0, 1 << 20));
  c->add_option("--tensor-parallel-size", a->bench.tensor_parallel_size,
                "Tensor-parallel ranks (-tp; run under mpirun -np N)")
      ->check(CLI::Range(1, 4096));
  c->add_option("--pipeline-parallel-size", a->bench.pipeline_parallel_size,
                "Pipeline stages (-pp, not --pp; the layers split over them; on the CPU)")
      ->check(CLI::Range(1, 4096));
  c->add_option("--data-parallel-size", a->bench.data_parallel_size,
                "Data-parallel replicas (-dp; the job has tp x pp x dp processes: "
                "mpirun -np tp*pp*dp)")
      ->check(CLI::Range(1, 4096));
  c->add_flag("--enable-expert-parallel", a->bench.enable_expert_parallel,
              "MoE models under -tp: whole routed experts per rank instead of a slice of each");
  c->add_option("-t,--threads", a->bench.threads, "Threads (0 = physical cores)")
      ->check(CLI::Range(0, 1024));
  AddDeviceOptions(c, &a->bench.device, &a->bench.huge_pages);
  AddKvCacheDtypeOption(c, &a->bench.kv_dtype);
  c->add_option("--batch", a->bench.batch,
                "Also decode --tg tokens in this many sequences at once through the engine "
                "(and in one, for the scaling)")
      ->check(CLI::Range(0, 4096));
  c->add_flag("--json", a->json, "Print JSON");
  CLI::App* serve = RegisterBenchServe(*c, exit_code);
  CLI::App* suite = RegisterBenchSuite(*c, exit_code);
  c->require_subcommand(0, 1);
  c->callback([a, exit_code, serve, suite] {
    if (serve->parsed() || suite->parsed()) return;
    if (a->bench.model_path.empty()) {
      std::fprintf(stderr, "peng: error: bench: --model is required\n");
      *exit_code = 2;
      return;
    }
    *exit_code = RunBench(*a);
  });
}

}  // namespace peng::tools
