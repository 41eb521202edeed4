#include "benchclient/report.h"

#include <cmath>

#include "benchclient/stats.h"

namespace peng::benchclient {
namespace {

using Json = nlohmann::json;

Json ToJson(const Distribution& d) {
  return {{"count", d.count}, {"mean", d.mean}, {"median", d.median}, {"p90", d.p90},
          {"p99", d.p99},     {"min", d.min},   {"max", d.max}};
}

Json Ms(double s) { return s * 1e3; }

Json PerRequest(const RequestResult& r, int i) {
  Json itl = Json::array();
  for (double g : r.itl_s) itl.push_back(Ms(g));
  Json j = {{"index", i},
            {"ok", r.ok},
            {"start_s", r.start_s},
            {"ttft_ms", Ms(r.ttft_s)},
            {"e2e_ms", Ms(r.e2e_s)},
            {"itl_ms", std::move(itl)},
            {"prompt_tokens", r.prompt_tokens},
            {"output_tokens", r.output_tokens},
            {"usage_reported", r.usage_reported},
            {"finish_reason", r.finish_reason}};
  if (!r.ok) {
    j["error"] = r.error;
    j["http_status"] = r.http_status;
  }
  return j;
}

}  // namespace

Json BuildReport(const BenchConfig& config, const BenchRun& run) {
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t completed = 0, input_tokens = 0, output_tokens = 0, no_usage = 0;
  Json requests = Json::array();
  Json errors = Json::array();
  for (size_t i = 0; i < run.results.size(); ++i) {
    const RequestResult& r = run.results[i];
    requests.push_back(PerRequest(r, static_cast<int>(i)));
    if (!r.ok) {
      if (errors.size() < 10) errors.push_back(r.error);
      continue;
    }
    ++completed;
    input_tokens += r.prompt_tokens >= 0 ? r.prompt_tokens : config.input_len;
    output_tokens += r.output_tokens;
    if (!r.usage_reported) ++no_usage;
    ttft.push_back(r.ttft_s * 1e3);
    e2e.push_back(r.e2e_s * 1e3);
    for (double g : r.itl_s) itl.push_back(g * 1e3);
    if (r.output_tokens > 1)
      tpot.push_back((r.e2e_s - r.ttft_s) * 1e3 / static_cast<double>(r.output_tokens - 1));
  }
  const double dur = run.duration_s > 0 ? run.duration_s : 1e-9;
  Json cfg = {
      {"url", config.client.url},
      {"endpoint", config.client.endpoint},
      {"model", config.client.model},
      {"num_prompts", config.num_prompts},
      {"request_rate", std::isinf(config.request_rate) ? Json("inf") : Json(config.request_rate)},
      {"max_concurrency", config.max_concurrency},
      {"input_len", config.input_len},
      {"output_len", config.output_len},
      {"temperature", config.client.temperature},
      {"ignore_eos", config.client.ignore_eos},
      {"seed", config.seed},
      {"workers", run.num_workers}};
  Json summary = {{"completed", completed},
                  {"failed", static_cast<int64_t>(run.results.size()) - completed},
                  {"duration_s", run.duration_s},
                  {"total_input_tokens", input_tokens},
                  {"total_output_tokens", output_tokens},
                  {"requests_without_usage", no_usage},
                  {"request_throughput", completed / dur},
                  {"output_throughput", output_tokens / dur},
                  {"total_token_throughput", (input_tokens + output_tokens) / dur},
                  {"ttft_ms", ToJson(Summarize(ttft))},
                  {"tpot_ms", ToJson(Summarize(tpot))},
                  {"itl_ms", ToJson(Summarize(itl))},
                  {"e2e_ms", ToJson(Summarize(e2e))},
                  {"errors", std::move(errors)}};
  return {{"config", std::move(cfg)},
          {"summary", std::move(summary)},
          {"requests", std::move(requests)}};
}

void PrintReport(const Json& report, std::FILE* out) {
  const Json& s = report["summary"];
  const Json& c = report["config"];
  auto line = [&](const char* name, const std::string& value) {
    std::fprintf(out, "%-34s %s\n", name, value.c_str());
  };
  auto num = [](double v, const char* fmt) {
    char b[64];
    std::snprintf(b, sizeof b, fmt, v);
    return std::string(b);
  };
  std::fprintf(out, "============ Serving Benchmark Result ============\n");
  line("Model:", c["model"].get<std::string>());
  line("Endpoint:", c["url"].get<std::string>() + c["endpoint"].get<std::string>());
  line("Request rate (req/s):", c["request_rate"].is_string() ? c["request_rate"].get<std::string>()
                                                              : num(c["request_rate"], "%g"));
  line("Max concurrency:", c["max_concurrency"].get<int>() > 0
                               ? std::to_string(c["max_concurrency"].get<int>())
                               : std::string("unlimited"));
  line("Successful requests:", std::to_string(s["completed"].get<int64_t>()));
  line("Failed requests:", std::to_string(s["failed"].get<int64_t>()));
  line("Benchmark duration (s):", num(s["duration_s"], "%.2f"));
  line("Total input tokens:", std::to_string(s["total_input_tokens"].get<int64_t>()));
  line("Total generated tokens:", std::to_string(s["total_output_tokens"].get<int64_t>()));
  line("Request throughput (req/s):", num(s["request_throughput"], "%.2f"));
  line("Output token throughput (tok/s):", num(s["output_throughput"], "%.2f"));
  line("Total token throughput (tok/s):", num(s["total_token_throughput"], "%.2f"));
  std::fprintf(out, "%-10s %10s %10s %10s %10s %10s\n", "(ms)", "mean", "median", "p90", "p99",
               "max");
  for (const char* key : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"}) {
    const Json& d = s[key];
    std::string label(key);
    label = label.substr(0, label.find('_'));
    for (char& ch : label) ch = static_cast<char>(std::toupper(ch));
    std::fprintf(out, "%-10s %10.2f %10.2f %10.2f %10.2f %10.2f\n", label.c_str(),
                 d["mean"].get<double>(), d["median"].get<double>(), d["p90"].get<double>(),
                 d["p99"].get<double>(), d["max"].get<double>());
  }
  if (s["requests_without_usage"].get<int64_t>() > 0) {
    std::fprintf(out,
                 "note: %lld requests had no usage in the stream: their output tokens are "
                 "counted as text chunks and their input tokens as --input-len\n",
                 static_cast<long long>(s["requests_without_usage"]));
  }
  for (const Json& e : s["errors"]) std::fprintf(out, "error: %s\n", e.get<std::string>().c_str());
  std::fprintf(out, "==================================================\n");
}

}  // namespace peng::benchclient
