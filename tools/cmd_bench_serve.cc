// peng bench serve: the online serving benchmark. Sends --num-prompts streaming requests of
// about --input-len prompt tokens and --output-len generated tokens to any OpenAI-compatible
// server at Poisson arrival times (--request-rate req/s, "inf" = all at once, optionally capped
// at --max-concurrency in flight) and reports TTFT, TPOT, ITL and end-to-end latency
// percentiles plus request and token throughput; --out writes JSON, --plot an SVG picture.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>

#include <nlohmann/json.hpp>

#include "benchclient/report.h"
#include "benchclient/runner.h"
#include "benchclient/svg_plot.h"
#include "tools/commands.h"

namespace peng::tools {
namespace {

struct BenchServeArgs {
  benchclient::BenchConfig config;
  std::string request_rate = "inf";
  std::string out_path;
  std::string plot_path;
  bool no_ignore_eos = false;
};

int RunBenchServe(BenchServeArgs a) {
  benchclient::BenchConfig& cfg = a.config;
  cfg.client.ignore_eos = !a.no_ignore_eos;
  if (a.request_rate == "inf" || a.request_rate == "infinity") {
    cfg.request_rate = std::numeric_limits<double>::infinity();
  } else {
    try {
      cfg.request_rate = std::stod(a.request_rate);
    } catch (const std::exception&) {
      cfg.request_rate = -1;
    }
    if (!(cfg.request_rate > 0)) {
      std::fprintf(stderr, "peng: error: --request-rate must be a positive number or inf\n");
      return 2;
    }
  }
  while (!cfg.client.url.empty() && cfg.client.url.back() == '/') cfg.client.url.pop_back();
  auto client = benchclient::OpenAiClient::Create(cfg.client);
  if (!client.ok()) {
    std::fprintf(stderr, "peng: error: %s\n", client.status().message().c_str());
    return 2;
  }
  if (cfg.client.model.empty()) {
    auto id = (*client)->FirstModelId();
    if (!id.ok()) return Fail(id.status().ToString() + " (pass --model to skip this)");
    cfg.client.model = *id;
  }
  std::fprintf(stderr, "model %s; sending one test request...\n", cfg.client.model.c_str());
  const benchclient::RequestResult probe = (*client)->Stream("Hello, how are you?", 4);
  if (!probe.ok)
    return Fail("test request to " + cfg.client.url + cfg.client.endpoint +
                " failed: " + probe.error);
  std::fprintf(stderr, "test request ok; starting %d requests\n", cfg.num_prompts);
  const bool tty = isatty(fileno(stderr));
  benchclient::BenchRun run = benchclient::RunBenchmark(cfg, [&](int done, int total) {
    if (tty) std::fprintf(stderr, "\r%d/%d requests done", done, total);
  });
  if (tty) std::fprintf(stderr, "\n");
  const nlohmann::json report = benchclient::BuildReport(cfg, run);
  benchclient::PrintReport(report, stdout);
  if (!a.out_path.empty()) {
    if (Status s = WriteFile(a.out_path, report.dump(2) + "\n"); !s.ok()) return Fail(s.ToString());
    std::printf("results written to %s\n", a.out_path.c_str());
  }
  if (!a.plot_path.empty()) {
    if (Status s = WriteFile(a.plot_path, benchclient::RenderSvg(report)); !s.ok())
      return Fail(s.ToString());
    std::printf("plot written to %s\n", a.plot_path.c_str());
  }
  return report["summary"]["completed"].get<int64_t>() > 0 ? 0 : 1;
}

}  // namespace

CLI::App* RegisterBenchServe(CLI::App& bench, int* exit_code) {
  auto a = std::make_shared<BenchServeArgs>();
  benchclient::BenchConfig& c = a->config;
  CLI::App* s = bench.add_subcommand(
      "serve", "Serving benchmark against any OpenAI-compatible server (TTFT, TPOT, ITL)");
  s->add_option("--url", c.client.url, "Server base URL")->capture_default_str();
  s->add_option("--endpoint", c.client.endpoint, "/v1/completions or /v1/chat/completions")
      ->capture_default_str();
  s->add_option("--model", c.client.model, "Model name to send (default: first of /v1/models)");
  s->add_option("--api-key", c.client.api_key, "Bearer token")->envname("OPENAI_API_KEY");
  s->add_option("-n,--num-prompts", c.num_prompts, "Requests to send")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  s->add_option("--request-rate", a->request_rate,
                "Poisson arrival rate in requests/s; inf sends all at once")
      ->capture_default_str();
  s->add_option("--max-concurrency", c.max_concurrency, "Most requests in flight (0 = no cap)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  s->add_option("--input-len", c.input_len, "Prompt length in words (about one token each)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  s->add_option("--output-len", c.output_len, "max_tokens of every request")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  s->add_option("--seed", c.seed, "Seed of prompts and arrival times")->capture_default_str();
  s->add_option("--temperature", c.client.temperature, "Sampling temperature")
      ->check(CLI::Range(0.0, 2.0))
      ->capture_default_str();
  s->add_flag("--no-ignore-eos", a->no_ignore_eos,
              "Do not send ignore_eos: true (requests may end before --output-len)");
  s->add_option("--extra-body", c.client.extra_body,
                "JSON object merged into every request body, e.g. "
                "'{\"response_format\": {\"type\": \"json_object\"}}'")
      ->check([](const std::string& v) -> std::string {
        auto j = nlohmann::json::parse(v, nullptr, false);
        return j.is_object() ? "" : "--extra-body must be a JSON object";
      });
  s->add_option("--timeout", c.client.timeout_s, "Per-request timeout in seconds")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  s->add_option("--out", a->out_path, "Write results as JSON to this file");
  s->add_option("--plot", a->plot_path, "Write an SVG plot to this file");
  s->callback([a, exit_code] { *exit_code = RunBenchServe(*a); });
  return s;
}

}  // namespace peng::tools
