// The monthly benchmark (`peng bench suite`, tools/cmd_bench_suite.cc) without its processes:
// the JSON configuration and its validation, where a report folder goes and which earlier
// report it is compared with, the comparison itself (regressions), and the Markdown summary
// and SVG plots of a report. Everything here works on plain JSON so that it is tested on small
// hand-made documents; the tool runs the benchmarks and fills the report in.
//
// A report (report.json) is
//   {"format": "peng-bench-suite/1", "date": "YYYY-MM-DD", "started": "YYYY-MM-DDTHH:MM:SS",
//    "duration_s": s, "threads": T,
//    "machine": {"cpu": ..., "logical_cpus": N, "isa": ..., "git_commit": ...},
//    "config": <the configuration file as given>,
//    "peer": {"name": ..., "ran": bool, "note": ...}            (only when one is configured)
//    "models": [{"name": ..., "path": ...,
//                "offline": <peng bench --json document> | {"error": ...}   (absent: skipped)
//                "serve": {"peng": [RUN...], "peer": [RUN...]}}]}            (peer: if it ran)
// with RUN = {"concurrency": C, "num_prompts": N, "summary": <BuildReport's summary>} or
// {"concurrency": C, "error": ...} when the server could not be started or the run failed.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace peng::benchclient {

// Worse by more than this (in %) than the previous report: flagged as a regression.
inline constexpr double kRegressionThresholdPct = 5.0;

struct SuiteModel {
  std::string name;  // used in file names: [A-Za-z0-9._-]+
  std::string path;  // GGUF file or HF folder, relative to the current directory
};

struct SuitePeer {
  std::string name = "peer";
  // argv of the peer server; the placeholders of kPeerPlaceholders are replaced per model.
  std::vector<std::string> command;
};

// {model} model path, {port} its loopback port, {threads} config threads, {slots} the largest
// concurrency (parallel sequences the server must hold), {max_model_len} tokens per sequence,
// {ctx} = slots x max_model_len (llama-server's -c is the context of all slots together).
inline constexpr const char* kPeerPlaceholders[] = {"model", "port",          "threads",
                                                    "slots", "max_model_len", "ctx"};

struct SuiteConfig {
  std::vector<SuiteModel> models;
  int threads = 0;  // 0: all logical CPUs (resolved by the tool)
  // Offline (`peng bench`): pp / tg tokens, repetitions; pp = tg = 0 skips it.
  int pp = 128;
  int tg = 32;
  int reps = 3;
  // Serving: one run per concurrency C with C clients and prompts_per_client x C requests.
  std::vector<int> concurrency = {1, 4, 16};
  int prompts_per_client = 2;
  int input_len = 128;  // words per prompt (about one token each)
  int output_len = 64;  // max_tokens, with ignore_eos
  uint64_t seed = 0;
  double health_timeout_s = 180;   // server start -> /health 200
  double request_timeout_s = 600;  // one request
  std::optional<SuitePeer> peer;
  std::string out_dir = "docs/bench-reports";

  // Sequence length the servers are started with: word prompts tokenize to a bit more than
  // one token per word, plus the chat-free completion's output and some slack.
  int max_model_len() const { return input_len * 2 + output_len + 64; }
  int max_concurrency() const;
};

// Validates a parsed configuration: unknown keys, wrong types and out-of-range values are
// InvalidArgument naming the key ("serve.concurrency[2]: ..."); with `check_files`, a model
// path that does not exist is NotFound naming "models[i].path" and the path.
StatusOr<SuiteConfig> ParseSuiteConfig(const nlohmann::json& config, bool check_files = true);
// Reads and parses `path`; errors are prefixed with it.
StatusOr<SuiteConfig> LoadSuiteConfig(const std::string& path, nlohmann::json* raw = nullptr);

// The peer's argv for one model: every {name} replaced by vars[name].
std::vector<std::string> ExpandCommand(
    const std::vector<std::string>& command,
    const std::vector<std::pair<std::string, std::string>>& vars);

// <out_dir>/<date>, or <date>-2, -3, ... when that exists already (the folder is not created).
std::string NewReportFolder(const std::string& out_dir, const std::string& date);
// report.json of the newest dated folder (YYYY-MM-DD or YYYY-MM-DD-N) in out_dir other than
// `exclude_folder` (a folder name, e.g. the one being written); nullopt when there is none.
std::optional<std::string> FindPreviousReport(const std::string& out_dir,
                                              const std::string& exclude_folder = "");

// One compared number of peng, with the same number of the peer and of the previous report.
struct MetricChange {
  std::string model;
  std::string id;     // comparable across reports: includes threads and workload
  std::string label;  // "pp128 tok/s", "c=4 TTFT p50 ms"
  bool higher_is_better = true;
  double value = 0;
  std::optional<double> peer;
  std::optional<double> previous;
  std::optional<double> change_pct;  // (value - previous) / previous x 100
  bool regression = false;           // worse than previous by more than the threshold
};

// peng's numbers of `current` in report order (per model: pp, tg, then per concurrency output
// tok/s, TTFT p50, TTFT p99, TPOT p50), each matched with the peer's and, by model name and id,
// with `previous` (may be null). Runs without completed requests give no numbers.
std::vector<MetricChange> CompareSuiteReports(const nlohmann::json& current,
                                              const nlohmann::json* previous,
                                              double threshold_pct = kRegressionThresholdPct);

// summary.md: header (machine, commit, what it is compared with), the regressions, one table per
// model, notes on failures, and the plots (file names relative to the report folder).
std::string RenderSuiteMarkdown(const nlohmann::json& current, const nlohmann::json* previous,
                                const std::string& previous_path,
                                const std::vector<std::string>& plot_files);

// SVG plots: per model with serving results, "<model>-serve.svg": output tokens/s and TTFT p50
// against concurrency for peng, the peer and peng in the previous report. {file name, svg}.
std::vector<std::pair<std::string, std::string>> RenderSuitePlots(const nlohmann::json& current,
                                                                  const nlohmann::json* previous);

}  // namespace peng::benchclient
