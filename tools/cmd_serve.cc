// peng serve: the OpenAI-compatible HTTP server over the continuous-batching engine.
// SIGTERM / SIGINT drain: /health and new requests answer 503 at once, running requests finish
// (for at most --drain-timeout seconds, then they are aborted), then the process exits 0. A
// second signal during the drain stops at once (running requests aborted), exit 0 too.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "engine/engine.h"
#include "engine/engine_core.h"
#include "parallel/communicator.h"
#include "server/byte_size.h"
#include "server/server.h"
#include "tools/commands.h"

namespace peng::tools {
namespace {

struct ServeArgs {
  EngineOptions engine;
  server::ServerOptions server;
  std::string kv_cache_memory;
  bool no_prefix_caching = false;
  double drain_timeout_s = 30;
  double idle_timeout_s = 60;
  std::string tool_call_parser = "auto";
  double peak_bandwidth_gbs = 0;   // 0 = measure at start-up
  double peak_gflops = 0;
  double peak_int8_gops = 0;
};

int RunServe(ServeArgs& a) {
  if (!a.kv_cache_memory.empty()) {
    StatusOr<int64_t> bytes = server::ParseByteSize(a.kv_cache_memory);
    if (!bytes.ok()) return Fail(bytes.status().message());
    a.engine.kv_cache_bytes = *bytes;
  }
  a.engine.enable_prefix_caching = !a.no_prefix_caching;
  a.engine.peak_read_bytes_per_s = a.peak_bandwidth_gbs * 1e9;
  a.engine.peak_flops_f32_per_s = a.peak_gflops * 1e9;
  a.engine.peak_ops_int8_per_s = a.peak_int8_gops * 1e9;
  StatusOr<server::ToolCallFormat> parser = server::ParseToolCallFormat(a.tool_call_parser);
  if (!parser.ok()) return Fail(parser.status().message());
  a.server.tool_call_parser = *parser;
  if (a.server.served_model_name.empty()) a.server.served_model_name = a.engine.model_path;
  auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
  a.server.drain_timeout = ms(a.drain_timeout_s);
  a.server.idle_timeout = ms(a.idle_timeout_s);

  // Every thread created from here on inherits the blocked signals; one thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  // Under mpirun, SIGTERM/SIGINT to mpirun kill the whole job at once; SIGUSR1 is forwarded to
  // every rank, so it is the graceful drain there (rank 0 drains; the other ranks keep it
  // blocked and end when rank 0 does). docs/parallelism.md.
  if (LaunchedByMpirun()) sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Tensor-parallel ranks > 0 serve rank 0's batches (with the signals blocked: rank 0 drains
  // and then ends their loop).
  StatusOr<bool> worker = RunParallelWorker(a.engine);
  if (!worker.ok()) return Fail(worker.status().ToString());
  if (*worker) return 0;
  StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(a.engine);
  if (!engine.ok()) return Fail(engine.status().ToString());
  server::Server srv(engine->get(), a.server);
  if (Status s = srv.Bind(); !s.ok()) {
    (*engine)->Stop();
    return Fail(s.ToString());
  }
  std::atomic<bool> served_done{false};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (served_done) return;  // woken by the main thread: the listener failed
    std::fprintf(stderr, "peng: signal %d: draining (a second signal stops at once)\n", sig);
    std::thread drainer([&] { srv.Shutdown(); });
    // A second signal during the drain stops at once; the main thread's wake-up ends the wait.
    sigwait(&signals, &sig);
    if (!served_done) {
      std::fprintf(stderr, "peng: signal %d: stopping now\n", sig);
      srv.Stop();
    }
    drainer.join();
  });
  std::fprintf(stderr, "peng: serving %s as '%s' on http://%s:%d (max_model_len %lld)\n",
               a.engine.model_path.c_str(), a.server.served_model_name.c_str(),
               a.server.host.c_str(), srv.port(),
               static_cast<long long>((*engine)->max_model_len()));
  const EngineStats peaks = (*engine)->GetStats();
  std::fprintf(stderr, "peng: KV cache: %lld blocks of %d tokens, %s\n",
               static_cast<long long>(peaks.kv_blocks_total), a.engine.block_size,
               KvCacheDtypeName(a.engine.kv_dtype).c_str());
  std::fprintf(stderr,
               "peng: machine peaks (utilization denominators): read %.1f GB/s, FP32 %.0f "
               "GFLOP/s, int8 %.0f GOP/s\n",
               peaks.peak_read_bytes_per_s / 1e9, peaks.peak_flops_f32_per_s / 1e9,
               peaks.peak_ops_int8_per_s / 1e9);
  Status served = srv.Serve();
  served_done = true;
  pthread_kill(waiter.native_handle(), SIGTERM);  // wakes the waiter (a blocked signal queues)
  waiter.join();
  (*engine)->Stop();
  if (!served.ok()) return Fail(served.ToString());
  std::fprintf(stderr, "peng: drained, exiting\n");
  return 0;
}

}  // namespace

void RegisterServe(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ServeArgs>();
  a->server.served_model_name.clear();  // default: the model argument, as given
  CLI::App* c = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  c->add_option("model", a->engine.model_path, "GGUF file or Hugging Face model folder")
      ->required();
  c->add_option("--host", a->server.host, "Address to listen on")->capture_default_str();
  c->add_option("--port", a->server.port, "Port (0 = any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  c->add_option("--api-key", a->server.api_key,
                "Require 'Authorization: Bearer KEY' on /v1/ routes");
  c->add_option("--served-model-name", a->server.served_model_name,
                "Model name in the API (default: the model argument)");
  c->add_option("--max-num-seqs", a->engine.max_num_seqs, "Running sequences at most")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  c->add_option("--max-model-len", a->engine.max_model_len,
                "Prompt + output tokens per sequence (capped by the model)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  c->add_option("--max-num-batched-tokens", a->engine.max_num_batched_tokens,
                "Tokens per engine step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  c->add_option("--kv-cache-memory", a->kv_cache_memory,
                "KV cache pool size, e.g. 512MiB, 2GB (default: derived from max-num-seqs)");
  c->add_option("--num-kv-blocks", a->engine.num_kv_blocks,
                "KV cache pool size in blocks of 16 tokens (overrides --kv-cache-memory)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  c->add_option("--tensor-parallel-size", a->engine.tensor_parallel_size,
                "Tensor-parallel ranks (-tp; run under mpirun -np N)")
      ->check(CLI::Range(1, 4096));
  c->add_option("--pipeline-parallel-size", a->engine.pipeline_parallel_size,
                "Pipeline stages (-pp; the layers split over them; on the CPU)")
      ->check(CLI::Range(1, 4096));
  c->add_option("--data-parallel-size", a->engine.data_parallel_size,
                "Data-parallel replicas (-dp; the job has tp x pp x dp processes: "
                "mpirun -np tp*pp*dp)")
      ->check(CLI::Range(1, 4096));
  c->add_flag("--enable-expert-parallel", a->engine.enable_expert_parallel,
              "MoE models under -tp: whole routed experts per rank instead of a slice of each");
  c->add_option("--threads", a->engine.threads, "Compute threads (0 = physical cores)")
      ->check(CLI::Range(0, 1024));
  AddDeviceOptions(c, &a->engine.device, &a->engine.huge_pages);
  c->add_option("--gpu-memory-utilization", a->engine.gpu_memory_utilization,
                "With --device cuda: the share of the GPU's memory this server may fill "
                "(weights, scratch, KV cache); the default KV cache stops there")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  AddKvCacheDtypeOption(c, &a->engine.kv_dtype);
  c->add_option("--max-waiting", a->engine.max_waiting,
                "Queued requests at most; beyond that requests get 429")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  c->add_option("--max-body-bytes", a->server.max_body_bytes, "Larger request bodies get 413")
      ->capture_default_str();
  c->add_flag("--protect-metrics", a->server.protect_metrics,
              "/metrics needs the API key too (with --api-key)");
  c->add_option("--max-connections", a->server.max_connections,
                "Open connections at most; more get 503 (capped by the open-file limit)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20))
      ->capture_default_str();
  c->add_option("--drain-timeout", a->drain_timeout_s,
                "Seconds running requests get to finish after SIGTERM")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  c->add_option("--idle-timeout", a->idle_timeout_s,
                "Seconds a keep-alive connection may wait for its next request")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  c->add_flag("--no-prefix-caching", a->no_prefix_caching, "Disable automatic prefix caching");
  c->add_option("--tool-call-parser", a->tool_call_parser,
                "Tool-call syntax of the model: auto (from the chat template), hermes, "
                "llama3_json, deepseek_v3 or none")
      ->check(CLI::IsMember({"auto", "hermes", "llama3_json", "deepseek_v3", "none"}))
      ->capture_default_str();
  c->add_option("--peak-bandwidth", a->peak_bandwidth_gbs,
                "Memory read bandwidth in GB/s for the utilization gauges (0 = measure at "
                "start-up)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--peak-gflops", a->peak_gflops,
                "FP32 peak in GFLOP/s for the utilization gauges (0 = measure)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--peak-int8-gops", a->peak_int8_gops,
                "int8 dot-product peak in GOP/s for the utilization gauges (0 = measure)")
      ->check(CLI::NonNegativeNumber);
  c->callback([a, exit_code] { *exit_code = RunServe(*a); });
}

}  // namespace peng::tools
