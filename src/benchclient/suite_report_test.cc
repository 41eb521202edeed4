// The monthly benchmark's configuration validation, report folders, comparison with the
// previous report and rendering, on small hand-made JSON.
#include "benchclient/suite_report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace peng::benchclient {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// A fresh empty folder under the test temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("suite_report_test_" + std::to_string(getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  void Touch(const fs::path& rel, const std::string& text = "{}") {
    fs::create_directories((path_ / rel).parent_path());
    std::ofstream(path_ / rel) << text;
  }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

std::string ConfigError(const std::string& text) {
  StatusOr<SuiteConfig> c = ParseSuiteConfig(Json::parse(text), /*check_files=*/false);
  return c.ok() ? "ok" : c.status().message();
}

TEST(SuiteConfigTest, DefaultsAndAllKeys) {
  StatusOr<SuiteConfig> c =
      ParseSuiteConfig(Json::parse(R"({"models": [{"name": "a", "path": "a.gguf"}]})"), false);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->models.size(), 1u);
  EXPECT_EQ(c->threads, 0);
  EXPECT_EQ(c->pp, 128);
  EXPECT_EQ(c->concurrency, (std::vector<int>{1, 4, 16}));
  EXPECT_FALSE(c->peer.has_value());
  EXPECT_EQ(c->out_dir, "docs/bench-reports");

  c = ParseSuiteConfig(Json::parse(R"({
      "comment": "x", "models": [{"name": "a", "path": "a.gguf"}, {"name": "b.2", "path": "b"}],
      "threads": 2, "offline": {"pp": 64, "tg": 0, "reps": 1},
      "serve": {"concurrency": [2, 8], "prompts_per_client": 3, "input_len": 16,
                "output_len": 8, "seed": 7, "health_timeout_s": 30, "request_timeout_s": 60.5},
      "peer": {"name": "llama.cpp", "command": ["srv", "-m", "{model}", "--port", "{port}"]},
      "out_dir": "out/r"})"),
                       false);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->models[1].name, "b.2");
  EXPECT_EQ(c->threads, 2);
  EXPECT_EQ(c->pp, 64);
  EXPECT_EQ(c->tg, 0);
  EXPECT_EQ(c->concurrency, (std::vector<int>{2, 8}));
  EXPECT_EQ(c->max_concurrency(), 8);
  EXPECT_EQ(c->prompts_per_client, 3);
  EXPECT_EQ(c->max_model_len(), 16 * 2 + 8 + 64);
  EXPECT_EQ(c->seed, 7u);
  EXPECT_DOUBLE_EQ(c->request_timeout_s, 60.5);
  ASSERT_TRUE(c->peer.has_value());
  EXPECT_EQ(c->peer->name, "llama.cpp");
  EXPECT_EQ(c->peer->command.size(), 5u);
  EXPECT_EQ(c->out_dir, "out/r");
}

TEST(SuiteConfigTest, ErrorsNameTheKey) {
  const std::string m = R"("models": [{"name": "a", "path": "a.gguf"}])";
  EXPECT_EQ(ConfigError(R"({"modles": []})"),
            "unknown key 'modles' (known keys: comment, models, threads, offline, serve, peer, "
            "out_dir)");
  EXPECT_EQ(ConfigError("{" + m + R"(, "offline": {"ppp": 1}})"),
            "unknown key 'offline.ppp' (known keys of offline: pp, tg, reps)");
  EXPECT_EQ(ConfigError("{}"), "models: missing (a list of {name, path})");
  EXPECT_EQ(ConfigError(R"({"models": {}})"),
            "models: expected a non-empty list of {name, path}, got {}");
  EXPECT_EQ(ConfigError(R"({"models": [{"name": "a"}]})"),
            "models[0].path: missing (a string is required)");
  EXPECT_EQ(ConfigError(R"({"models": [{"name": "a", "path": 3}]})"),
            "models[0].path: expected a non-empty string, got 3");
  EXPECT_EQ(ConfigError(R"({"models": ["a.gguf"]})"),
            "models[0]: expected a JSON object, got \"a.gguf\"");
  EXPECT_EQ(ConfigError(R"({"models": [{"name": "a/b", "path": "x"}]})"),
            "models[0].name: 'a/b' must be 1-64 letters, digits, '.', '_' or '-' (it names "
            "files)");
  EXPECT_EQ(ConfigError(R"({"models": [{"name": "a", "path": "x"}, {"name": "a", "path": "y"}]})"),
            "models[1].name: 'a' is used twice");
  EXPECT_EQ(ConfigError("{" + m + R"(, "threads": "2"})"),
            "threads: expected an integer in [0, 1024], got \"2\"");
  EXPECT_EQ(ConfigError("{" + m + R"(, "threads": true})"),
            "threads: expected an integer in [0, 1024], got true");
  EXPECT_EQ(ConfigError("{" + m + R"(, "offline": {"reps": 0}})"),
            "offline.reps: expected an integer in [1, 1000], got 0");
  EXPECT_EQ(ConfigError("{" + m + R"(, "serve": {"concurrency": [1, 2.5]}})"),
            "serve.concurrency[1]: expected an integer in [1, 4096], got 2.5");
  EXPECT_EQ(ConfigError("{" + m + R"(, "serve": {"concurrency": [4, 4]}})"),
            "serve.concurrency[1]: 4 is listed twice");
  EXPECT_EQ(ConfigError("{" + m + R"(, "serve": {"concurrency": 4}})"),
            "serve.concurrency: expected a list of integers, got 4");
  EXPECT_EQ(ConfigError("{" + m + R"(, "serve": {"health_timeout_s": "10"}})"),
            "serve.health_timeout_s: expected a number in [1, 3600], got \"10\"");
  EXPECT_EQ(ConfigError("{" + m + R"(, "serve": []})"), "serve: expected a JSON object, got []");
  EXPECT_EQ(ConfigError("{" + m + R"(, "peer": {"command": []}})"),
            "peer.command: expected a non-empty list of strings, got []");
  EXPECT_EQ(ConfigError("{" + m + R"(, "peer": {"command": ["s", 1]}})"),
            "peer.command[1]: expected a string, got 1");
  EXPECT_EQ(ConfigError("{" + m + R"(, "peer": {"command": ["s", "-m", "{modle}"]}})"),
            "peer.command[2]: unknown placeholder {modle} (known: {model}, {port}, {threads}, "
            "{slots}, {max_model_len}, {ctx})");
  EXPECT_EQ(ConfigError("{" + m + R"(, "out_dir": ""})"),
            "out_dir: expected a non-empty string, got \"\"");
  // JSON null is the same as leaving a key out.
  EXPECT_EQ(ConfigError("{" + m + R"(, "peer": null, "threads": null})"), "ok");
}

TEST(SuiteConfigTest, ModelFilesMustExist) {
  TempDir dir;
  dir.Touch("m.gguf");
  const std::string good = (dir.path() / "m.gguf").string();
  const std::string bad = (dir.path() / "missing.gguf").string();
  Json j = {{"models", {{{"name", "m"}, {"path", good}}, {{"name", "n"}, {"path", bad}}}}};
  StatusOr<SuiteConfig> c = ParseSuiteConfig(j);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c.status().message(), "models[1].path: " + bad + ": no such file or folder");
  j["models"].erase(1);
  EXPECT_TRUE(ParseSuiteConfig(j).ok());
}

TEST(SuiteConfigTest, LoadNamesTheFile) {
  TempDir dir;
  dir.Touch("bad.json", "{\"models\": [");
  dir.Touch("wrong.json", R"({"models": [{"name": "m", "path": "x"}], "threads": -1})");
  const std::string bad = (dir.path() / "bad.json").string();
  const std::string wrong = (dir.path() / "wrong.json").string();
  EXPECT_EQ(LoadSuiteConfig(bad).status().message(), bad + ": not valid JSON");
  EXPECT_EQ(LoadSuiteConfig(wrong).status().message(),
            wrong + ": threads: expected an integer in [0, 1024], got -1");
  EXPECT_EQ(LoadSuiteConfig((dir.path() / "none.json").string()).status().code(),
            StatusCode::kNotFound);
}

TEST(SuiteConfigTest, ExpandCommandReplacesEveryPlaceholder) {
  EXPECT_EQ(ExpandCommand({"srv", "-m", "{model}", "--port={port}", "-c", "{ctx}", "{x}", "{",
                           "{port}{port}"},
                          {{"model", "m.gguf"}, {"port", "8080"}, {"ctx", "1024"}}),
            (std::vector<std::string>{"srv", "-m", "m.gguf", "--port=8080", "-c", "1024", "{x}",
                                      "{", "80808080"}));
}

TEST(SuiteReportTest, ReportFolders) {
  TempDir dir;
  const std::string out = dir.path().string();
  EXPECT_EQ(FindPreviousReport(out), std::nullopt);
  EXPECT_EQ(FindPreviousReport(out + "/does-not-exist"), std::nullopt);
  EXPECT_EQ(NewReportFolder(out, "2026-12-01"), out + "/2026-12-01");
  for (const char* f :
       {"2026-11-01", "2026-12-01", "2026-12-01-2", "2026-12-01-10", "notes", "2026-13-1x"})
    dir.Touch(fs::path(f) / "report.json");
  dir.Touch("2026-12-02/summary.md");  // no report.json: an interrupted run
  EXPECT_EQ(FindPreviousReport(out), out + "/2026-12-01-10/report.json");
  EXPECT_EQ(FindPreviousReport(out, "2026-12-01-10"), out + "/2026-12-01-2/report.json");
  EXPECT_EQ(NewReportFolder(out, "2026-12-01"), out + "/2026-12-01-3");
  EXPECT_EQ(NewReportFolder(out, "2026-12-02"), out + "/2026-12-02-2");
}

Json ServeRun(int c, double tput, double ttft50, double ttft99, double tpot50, int failed = 0) {
  Json s = {{"completed", 2 * c - failed},
            {"failed", failed},
            {"output_throughput", tput},
            {"ttft_ms", {{"median", ttft50}, {"p99", ttft99}}},
            {"tpot_ms", {{"median", tpot50}, {"count", 2 * c - failed}}},
            {"errors", failed ? Json::array({"timeout"}) : Json::array()}};
  return {{"concurrency", c}, {"num_prompts", 2 * c}, {"summary", s}};
}

// A report of two models: "tiny" with pp / tg repetitions around `pp` / `tg` and the given
// serving runs (and a peer's when `peer`), and "broken", whose benchmarks all failed.
Json MakeReport(const std::string& date, double pp, double tg, Json peng_runs, bool peer) {
  Json r = {
      {"format", "peng-bench-suite/1"},
      {"date", date},
      {"threads", 2},
      {"duration_s", 321.4},
      {"machine",
       {{"cpu", "Test CPU"}, {"logical_cpus", 2}, {"isa", "avx2"}, {"git_commit", "abc123"}}},
      {"config",
       {{"offline", {{"reps", 3}}},
        {"serve", {{"input_len", 32}, {"output_len", 16}, {"prompts_per_client", 2}}}}},
      {"models",
       {{{"name", "tiny"},
         {"path", "models/tiny.gguf"},
         {"offline",
          {{"pp", {{"n", 128}, {"tokens_per_s", {pp, pp * 1.1, pp * 0.9}}}},
           {"tg", {{"n", 32}, {"tokens_per_s", {tg * 0.8, tg * 1.2}}}},
           {"weight_bytes_per_token", 96400000},
           {"mem_bandwidth_gbs", 17.3},
           {"bandwidth_bound_tokens_per_s", 179.5}}},
         {"serve", {{"peng", std::move(peng_runs)}}}},
        {{"name", "broken"},
         {"path", "models/broken.gguf"},
         {"offline", {{"error", "DataLoss: truncated"}}},
         {"serve",
          {{"peng", {{{"concurrency", 1}, {"error", "peng serve exited (exit code 1)"}}}}}}}}}};
  if (peer) {
    r["peer"] = {{"name", "llama.cpp"}, {"ran", true}};
    r["models"][0]["serve"]["peer"] = {ServeRun(1, 40, 50, 60, 20), ServeRun(4, 80, 100, 300, 40)};
  }
  return r;
}

TEST(SuiteReportTest, RegressionsAreWorseByMoreThanFivePercent) {
  const Json prev = MakeReport(
      "2026-11-01", 100, 50, {ServeRun(1, 50, 40, 50, 20), ServeRun(4, 100, 100, 200, 30)}, false);
  // pp -10% (regression), tg -5% exactly (not), c=1 output +10%, TTFT p50 +6% (regression),
  // TTFT p99 -10%, TPOT +5% exactly (not); c=4 output -5.1% (regression), TTFT p99 +50%.
  const Json cur =
      MakeReport("2026-12-01", 90, 47.5,
                 {ServeRun(1, 55, 42.4, 45, 21), ServeRun(4, 94.9, 100, 300, 30)}, true);
  const std::vector<MetricChange> rows = CompareSuiteReports(cur, &prev);
  ASSERT_EQ(rows.size(), 10u);
  std::vector<std::string> flagged;
  for (const MetricChange& r : rows)
    if (r.regression) flagged.push_back(r.label);
  EXPECT_EQ(flagged, (std::vector<std::string>{"pp128 tok/s", "c=1 TTFT p50 ms", "c=4 output tok/s",
                                               "c=4 TTFT p99 ms"}));
  EXPECT_EQ(rows[0].id, "t2/pp128");
  EXPECT_EQ(rows[2].id, "t2/serve-in32-out16/c1/output_tok_s");
  EXPECT_DOUBLE_EQ(rows[0].value, 90);  // median of the repetitions
  EXPECT_DOUBLE_EQ(*rows[1].change_pct, -5);
  EXPECT_FALSE(rows[1].regression);
  ASSERT_TRUE(rows[2].peer.has_value());
  EXPECT_DOUBLE_EQ(*rows[2].peer, 40);
  EXPECT_FALSE(rows[0].peer.has_value());

  // Nothing to compare with: no previous values, no regressions.
  for (const MetricChange& r : CompareSuiteReports(cur, nullptr)) {
    EXPECT_FALSE(r.previous.has_value());
    EXPECT_FALSE(r.regression);
  }
  // Another workload is another measurement: serving numbers are not matched.
  Json other = prev;
  other["config"]["serve"]["input_len"] = 64;
  int matched = 0;
  for (const MetricChange& r : CompareSuiteReports(cur, &other)) matched += r.previous.has_value();
  EXPECT_EQ(matched, 2);  // pp and tg only
}

TEST(SuiteReportTest, MarkdownSummary) {
  const Json prev = MakeReport(
      "2026-11-01", 100, 50, {ServeRun(1, 50, 40, 50, 20), ServeRun(4, 100, 100, 200, 30)}, false);
  const Json cur =
      MakeReport("2026-12-01", 90, 47.5,
                 {ServeRun(1, 55, 42.4, 45, 21), ServeRun(4, 94.9, 100, 300, 30, 1)}, true);
  EXPECT_EQ(RenderSuiteMarkdown(cur, &prev, "reports/2026-11-01/report.json", {"tiny-serve.svg"}),
            R"(# peng benchmark report 2026-12-01

peng `abc123`, Test CPU, 2 logical CPUs, kernels avx2, 2 threads; the suite took 321 s.

Compared with `reports/2026-11-01/report.json` (2026-11-01, peng `abc123`).
Peer: llama.cpp on the same model files, threads and serving workload.

Offline: `peng bench`, one prefill of pp tokens and tg decode steps, median of 3 repetitions. Serving: `peng serve` (and the peer) driven like `peng bench serve` by c concurrent streaming clients sending 2 x c requests of 32 prompt words and 16 output tokens (ignore_eos), all sent at once. Latencies in ms (lower is better); a change worse than 5% is flagged.

## Regressions

- **REGRESSION** tiny pp128 tok/s: 100.0 -> 90.0 (-10.0%)
- **REGRESSION** tiny c=1 TTFT p50 ms: 40.0 -> 42.4 (+6.0%)
- **REGRESSION** tiny c=4 output tok/s: 100.0 -> 94.9 (-5.1%)
- **REGRESSION** tiny c=4 TTFT p99 ms: 200.0 -> 300.0 (+50.0%)

## tiny (`models/tiny.gguf`)

| metric | peng | previous | change | llama.cpp | peng / llama.cpp |
|---|---|---|---|---|---|
| pp128 tok/s | 90.0 | 100.0 | -10.0% **REGRESSION** | | |
| tg32 tok/s | 47.5 | 50.0 | -5.0% | | |
| c=1 output tok/s | 55.0 | 50.0 | +10.0% | 40.0 | 1.38 |
| c=1 TTFT p50 ms | 42.4 | 40.0 | +6.0% **REGRESSION** | 50.0 | 0.85 |
| c=1 TTFT p99 ms | 45.0 | 50.0 | -10.0% | 60.0 | 0.75 |
| c=1 TPOT p50 ms | 21.0 | 20.0 | +5.0% | 20.0 | 1.05 |
| c=4 output tok/s | 94.9 | 100.0 | -5.1% **REGRESSION** | 80.0 | 1.19 |
| c=4 TTFT p50 ms | 100.0 | 100.0 | +0.0% | 100.0 | 1.00 |
| c=4 TTFT p99 ms | 300.0 | 200.0 | +50.0% **REGRESSION** | 300.0 | 1.00 |
| c=4 TPOT p50 ms | 30.0 | 30.0 | +0.0% | 40.0 | 0.75 |

- weights read per token 96.4 MB, read bandwidth 17.3 GB/s: decode bound 179.5 tok/s
- peng, c=4: 1 of 8 requests failed (first: timeout)

## broken (`models/broken.gguf`)

| metric | peng | previous | change | llama.cpp | peng / llama.cpp |
|---|---|---|---|---|---|
| (no results) | | | | | |

- offline benchmark failed: DataLoss: truncated
- peng, c=1: peng serve exited (exit code 1)

## Plots

![tiny-serve.svg](tiny-serve.svg)
)");

  // Without a previous report and without a peer (skipped, with the reason).
  // (Json::array: a one-element brace list is a copy of the element for clang, an array for GCC.)
  Json alone =
      MakeReport("2026-12-01", 90, 47.5, Json::array({ServeRun(1, 55, 42.4, 45, 21)}), false);
  alone["peer"] = {{"name", "llama.cpp"}, {"ran", false}, {"note", "srv was not found."}};
  alone["models"].erase(1);
  EXPECT_EQ(RenderSuiteMarkdown(alone, nullptr, "", {}),
            R"(# peng benchmark report 2026-12-01

peng `abc123`, Test CPU, 2 logical CPUs, kernels avx2, 2 threads; the suite took 321 s.

No previous report: nothing to compare with.
Peer llama.cpp not run: srv was not found.

Offline: `peng bench`, one prefill of pp tokens and tg decode steps, median of 3 repetitions. Serving: `peng serve` (and the peer) driven like `peng bench serve` by c concurrent streaming clients sending 2 x c requests of 32 prompt words and 16 output tokens (ignore_eos), all sent at once. Latencies in ms (lower is better); a change worse than 5% is flagged.

## Regressions

None (nothing to compare with).

## tiny (`models/tiny.gguf`)

| metric | peng | previous | change |
|---|---|---|---|
| pp128 tok/s | 90.0 | - |  |
| tg32 tok/s | 47.5 | - |  |
| c=1 output tok/s | 55.0 | - |  |
| c=1 TTFT p50 ms | 42.4 | - |  |
| c=1 TTFT p99 ms | 45.0 | - |  |
| c=1 TPOT p50 ms | 21.0 | - |  |

- weights read per token 96.4 MB, read bandwidth 17.3 GB/s: decode bound 179.5 tok/s
)");
}

TEST(SuiteReportTest, PlotsPerModelWithPeerAndPrevious) {
  const Json prev = MakeReport(
      "2026-11-01", 100, 50, {ServeRun(1, 50, 40, 50, 20), ServeRun(4, 100, 100, 200, 30)}, false);
  const Json cur =
      MakeReport("2026-12-01", 90, 47.5,
                 {ServeRun(1, 55, 42.4, 45, 21), ServeRun(4, 94.9, 100, 300, 30)}, true);
  const auto plots = RenderSuitePlots(cur, &prev);
  ASSERT_EQ(plots.size(), 1u);  // "broken" has no serving results
  EXPECT_EQ(plots[0].first, "tiny-serve.svg");
  const std::string& svg = plots[0].second;
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>\n"), std::string::npos);
  EXPECT_NE(svg.find("Output throughput"), std::string::npos);
  EXPECT_NE(svg.find("Time to first token"), std::string::npos);
  EXPECT_NE(svg.find(">llama.cpp</text>"), std::string::npos);
  EXPECT_NE(svg.find(">peng, previous (2026-11-01)</text>"), std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);
  size_t lines = 0;
  for (size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1))
    ++lines;
  EXPECT_EQ(lines, 6u);  // 2 charts x (peng, peer, previous)
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  // Without anything to draw: no file.
  Json empty = cur;
  empty["models"][0].erase("serve");
  EXPECT_TRUE(RenderSuitePlots(empty, nullptr).empty());
}

}  // namespace
}  // namespace peng::benchclient
