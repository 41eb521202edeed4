#include "benchclient/suite_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "benchclient/svg_plot.h"
#include "core/mapped_file.h"

namespace peng::benchclient {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

std::string Fmt(const char* fmt, double v) {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

// A JSON value as it appears in an error message, cut short.
std::string Shown(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

// Reads one object of the configuration: every key must be known, every value of its type.
// `where` is the key path of the object ("" for the top level, "serve", "models[1]").
class ObjectReader {
 public:
  ObjectReader(const Json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  // InvalidArgument unless `obj` is an object whose keys are all in `known`.
  Status Check(const std::vector<std::string>& known) const {
    if (!obj_.is_object())
      return InvalidArgument(Where() + "expected a JSON object, got " + Shown(obj_));
    for (const auto& [key, value] : obj_.items()) {
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      return InvalidArgument("unknown key '" + Key(key) + "' (known keys" +
                             (where_.empty() ? "" : " of " + where_) + ": " + list + ")");
    }
    return OkStatus();
  }

  bool Has(const std::string& key) const { return obj_.contains(key) && !obj_[key].is_null(); }
  const Json& Get(const std::string& key) const { return obj_[key]; }
  std::string Key(const std::string& key) const {
    return where_.empty() ? key : where_ + "." + key;
  }

  // Leaves *out unchanged when the key is absent or null.
  Status Int(const std::string& key, int lo, int hi, int* out) const {
    if (!Has(key)) return OkStatus();
    return ReadInt(obj_[key], Key(key), lo, hi, out);
  }
  Status Number(const std::string& key, double lo, double hi, double* out) const {
    if (!Has(key)) return OkStatus();
    const Json& v = obj_[key];
    if (!v.is_number() || !(v.get<double>() >= lo && v.get<double>() <= hi))
      return InvalidArgument(Key(key) + ": expected a number in [" + Fmt("%g", lo) + ", " +
                             Fmt("%g", hi) + "], got " + Shown(v));
    *out = v.get<double>();
    return OkStatus();
  }
  Status String(const std::string& key, bool required, std::string* out) const {
    if (!Has(key)) {
      if (required) return InvalidArgument(Key(key) + ": missing (a string is required)");
      return OkStatus();
    }
    const Json& v = obj_[key];
    if (!v.is_string() || v.get<std::string>().empty())
      return InvalidArgument(Key(key) + ": expected a non-empty string, got " + Shown(v));
    *out = v.get<std::string>();
    return OkStatus();
  }

  static Status ReadInt(const Json& v, const std::string& key, int lo, int hi, int* out) {
    // Booleans and 2.5 are not integers; 4.0 from a hand-written file is not either, on purpose.
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
      return InvalidArgument(key + ": expected an integer in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "], got " + Shown(v));
    *out = static_cast<int>(v.get<int64_t>());
    return OkStatus();
  }

 private:
  std::string Where() const { return where_.empty() ? "configuration: " : where_ + ": "; }
  const Json& obj_;
  std::string where_;
};

bool ValidName(const std::string& s) {
  if (s.empty() || s.size() > 64 || s[0] == '.') return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-')
      return false;
  return true;
}

// The {name} placeholders of one argument that are not known.
std::optional<std::string> UnknownPlaceholder(const std::string& arg) {
  for (size_t open = arg.find('{'); open != std::string::npos; open = arg.find('{', open + 1)) {
    const size_t close = arg.find('}', open);
    if (close == std::string::npos) return std::nullopt;  // a lone brace is literal text
    const std::string name = arg.substr(open + 1, close - open - 1);
    bool known = false;
    for (const char* k : kPeerPlaceholders) known = known || name == k;
    if (!known) return "{" + name + "}";
  }
  return std::nullopt;
}

Status ParsePeer(const Json& j, SuitePeer* peer) {
  ObjectReader r(j, "peer");
  PENG_RETURN_IF_ERROR(r.Check({"name", "command"}));
  PENG_RETURN_IF_ERROR(r.String("name", false, &peer->name));
  if (!r.Has("command"))
    return InvalidArgument("peer.command: missing (argv as a list of strings)");
  const Json& cmd = r.Get("command");
  if (!cmd.is_array() || cmd.empty())
    return InvalidArgument("peer.command: expected a non-empty list of strings, got " + Shown(cmd));
  for (size_t i = 0; i < cmd.size(); ++i) {
    const std::string key = "peer.command[" + std::to_string(i) + "]";
    if (!cmd[i].is_string())
      return InvalidArgument(key + ": expected a string, got " + Shown(cmd[i]));
    const std::string arg = cmd[i].get<std::string>();
    if (auto bad = UnknownPlaceholder(arg)) {
      std::string list;
      for (const char* k : kPeerPlaceholders)
        list += std::string(list.empty() ? "" : ", ") + "{" + k + "}";
      return InvalidArgument(key + ": unknown placeholder " + *bad + " (known: " + list + ")");
    }
    peer->command.push_back(arg);
  }
  if (peer->command[0].empty()) return InvalidArgument("peer.command[0]: empty program");
  return OkStatus();
}

// "YYYY-MM-DD" or "YYYY-MM-DD-N" -> (date, N) with N = 1 for the plain date.
std::optional<std::pair<std::string, int>> DatedFolder(const std::string& name) {
  auto digits = [&](size_t b, size_t n) {
    for (size_t i = b; i < b + n; ++i)
      if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return false;
    return true;
  };
  if (name.size() < 10 || !digits(0, 4) || name[4] != '-' || !digits(5, 2) || name[7] != '-' ||
      !digits(8, 2))
    return std::nullopt;
  if (name.size() == 10) return std::make_pair(name, 1);
  if (name[10] != '-' || name.size() > 16 || !digits(11, name.size() - 11)) return std::nullopt;
  return std::make_pair(name.substr(0, 10), std::stoi(name.substr(11)));
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

struct Metric {
  std::string id, label;
  bool higher_is_better;
  double value;
};

// The compared numbers of one engine's serving run, in table order.
void ServeMetrics(const Json& run, const std::string& prefix, std::vector<Metric>* out) {
  if (!run.contains("summary")) return;
  const Json& s = run.at("summary");
  if (s.value("completed", int64_t{0}) <= 0) return;
  const std::string c = std::to_string(run.at("concurrency").get<int>());
  const std::string id = prefix + "/c" + c + "/";
  out->push_back({id + "output_tok_s", "c=" + c + " output tok/s", true,
                  s.at("output_throughput").get<double>()});
  out->push_back({id + "ttft_p50_ms", "c=" + c + " TTFT p50 ms", false,
                  s.at("ttft_ms").at("median").get<double>()});
  out->push_back({id + "ttft_p99_ms", "c=" + c + " TTFT p99 ms", false,
                  s.at("ttft_ms").at("p99").get<double>()});
  // A run of one-token outputs has no TPOT; its count is 0.
  if (s.at("tpot_ms").value("count", int64_t{0}) > 0)
    out->push_back({id + "tpot_p50_ms", "c=" + c + " TPOT p50 ms", false,
                    s.at("tpot_ms").at("median").get<double>()});
}

// The serving workload that makes numbers comparable: threads, prompt and output lengths.
std::string ServePrefix(const Json& report) {
  const Json& serve = report.at("config").value("serve", Json::object());
  SuiteConfig defaults;
  return "t" + std::to_string(report.value("threads", 0)) + "/serve-in" +
         std::to_string(serve.value("input_len", defaults.input_len)) + "-out" +
         std::to_string(serve.value("output_len", defaults.output_len));
}

// All compared numbers of one engine ("peng" or "peer") of one model entry.
std::vector<Metric> ModelMetrics(const Json& report, const Json& model, const std::string& engine) {
  std::vector<Metric> out;
  const std::string t = "t" + std::to_string(report.value("threads", 0));
  if (engine == "peng" && model.contains("offline") && !model.at("offline").contains("error")) {
    const Json& o = model.at("offline");
    for (const char* test : {"pp", "tg"}) {
      if (!o.contains(test)) continue;
      const std::vector<double> tps = o.at(test).at("tokens_per_s");
      if (tps.empty()) continue;
      const std::string n = std::string(test) + std::to_string(o.at(test).at("n").get<int>());
      out.push_back({t + "/" + n, n + " tok/s", true, Median(tps)});
    }
  }
  if (model.contains("serve") && model.at("serve").contains(engine)) {
    const std::string prefix = ServePrefix(report);
    for (const Json& run : model.at("serve").at(engine)) ServeMetrics(run, prefix, &out);
  }
  return out;
}

const Json* FindModel(const Json& report, const std::string& name) {
  if (!report.contains("models")) return nullptr;
  for (const Json& m : report.at("models"))
    if (m.value("name", "") == name) return &m;
  return nullptr;
}

std::optional<double> FindMetric(const std::vector<Metric>& ms, const std::string& id) {
  for (const Metric& m : ms)
    if (m.id == id) return m.value;
  return std::nullopt;
}

std::string PeerName(const Json& report) {
  if (!report.contains("peer") || !report.at("peer").value("ran", false)) return "";
  return report.at("peer").value("name", "peer");
}

std::string Num(double v) { return Fmt("%.1f", v); }

std::string Commit(const Json& report) {
  return report.contains("machine") ? report.at("machine").value("git_commit", "unknown")
                                    : "unknown";
}

}  // namespace

int SuiteConfig::max_concurrency() const {
  return concurrency.empty() ? 1 : *std::max_element(concurrency.begin(), concurrency.end());
}

StatusOr<SuiteConfig> ParseSuiteConfig(const Json& j, bool check_files) {
  SuiteConfig c;
  ObjectReader top(j, "");
  PENG_RETURN_IF_ERROR(
      top.Check({"comment", "models", "threads", "offline", "serve", "peer", "out_dir"}));
  if (top.Has("comment") && !top.Get("comment").is_string())
    return InvalidArgument("comment: expected a string, got " + Shown(top.Get("comment")));
  if (!top.Has("models")) return InvalidArgument("models: missing (a list of {name, path})");
  const Json& models = top.Get("models");
  if (!models.is_array() || models.empty())
    return InvalidArgument("models: expected a non-empty list of {name, path}, got " +
                           Shown(models));
  std::set<std::string> names;
  for (size_t i = 0; i < models.size(); ++i) {
    const std::string where = "models[" + std::to_string(i) + "]";
    ObjectReader m(models[i], where);
    PENG_RETURN_IF_ERROR(m.Check({"name", "path"}));
    SuiteModel sm;
    PENG_RETURN_IF_ERROR(m.String("name", true, &sm.name));
    PENG_RETURN_IF_ERROR(m.String("path", true, &sm.path));
    if (!ValidName(sm.name))
      return InvalidArgument(where + ".name: '" + sm.name +
                             "' must be 1-64 letters, digits, '.', '_' or '-' (it names files)");
    if (!names.insert(sm.name).second)
      return InvalidArgument(where + ".name: '" + sm.name + "' is used twice");
    c.models.push_back(std::move(sm));
  }
  PENG_RETURN_IF_ERROR(top.Int("threads", 0, 1024, &c.threads));
  if (top.Has("offline")) {
    ObjectReader o(top.Get("offline"), "offline");
    PENG_RETURN_IF_ERROR(o.Check({"pp", "tg", "reps"}));
    PENG_RETURN_IF_ERROR(o.Int("pp", 0, 1 << 20, &c.pp));
    PENG_RETURN_IF_ERROR(o.Int("tg", 0, 1 << 20, &c.tg));
    PENG_RETURN_IF_ERROR(o.Int("reps", 1, 1000, &c.reps));
  }
  if (top.Has("serve")) {
    ObjectReader s(top.Get("serve"), "serve");
    PENG_RETURN_IF_ERROR(s.Check({"concurrency", "prompts_per_client", "input_len", "output_len",
                                  "seed", "health_timeout_s", "request_timeout_s"}));
    if (s.Has("concurrency")) {
      const Json& cs = s.Get("concurrency");
      if (!cs.is_array())
        return InvalidArgument("serve.concurrency: expected a list of integers, got " + Shown(cs));
      c.concurrency.clear();
      for (size_t i = 0; i < cs.size(); ++i) {
        int v = 0;
        PENG_RETURN_IF_ERROR(ObjectReader::ReadInt(
            cs[i], "serve.concurrency[" + std::to_string(i) + "]", 1, 4096, &v));
        if (std::find(c.concurrency.begin(), c.concurrency.end(), v) != c.concurrency.end())
          return InvalidArgument("serve.concurrency[" + std::to_string(i) +
                                 "]: " + std::to_string(v) + " is listed twice");
        c.concurrency.push_back(v);
      }
    }
    PENG_RETURN_IF_ERROR(s.Int("prompts_per_client", 1, 10000, &c.prompts_per_client));
    PENG_RETURN_IF_ERROR(s.Int("input_len", 1, 1 << 16, &c.input_len));
    PENG_RETURN_IF_ERROR(s.Int("output_len", 1, 1 << 16, &c.output_len));
    int seed = 0;
    PENG_RETURN_IF_ERROR(s.Int("seed", 0, 1 << 30, &seed));
    c.seed = static_cast<uint64_t>(seed);
    PENG_RETURN_IF_ERROR(s.Number("health_timeout_s", 1, 3600, &c.health_timeout_s));
    PENG_RETURN_IF_ERROR(s.Number("request_timeout_s", 1, 86400, &c.request_timeout_s));
  }
  if (top.Has("peer")) {
    SuitePeer peer;
    PENG_RETURN_IF_ERROR(ParsePeer(top.Get("peer"), &peer));
    c.peer = std::move(peer);
  }
  PENG_RETURN_IF_ERROR(top.String("out_dir", false, &c.out_dir));
  // Files last: a mistyped key is reported before a model that is not downloaded yet.
  for (size_t i = 0; check_files && i < c.models.size(); ++i) {
    std::error_code ec;
    if (!fs::exists(c.models[i].path, ec))
      return NotFound("models[" + std::to_string(i) + "].path: " + c.models[i].path +
                      ": no such file or folder");
  }
  return c;
}

StatusOr<SuiteConfig> LoadSuiteConfig(const std::string& path, Json* raw) {
  StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return NotFound(path + ": cannot open the configuration file");
  Json j = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(path + ": not valid JSON");
  StatusOr<SuiteConfig> c = ParseSuiteConfig(j);
  if (!c.ok()) return Status(c.status().code(), path + ": " + c.status().message());
  if (raw) *raw = std::move(j);
  return c;
}

std::vector<std::string> ExpandCommand(
    const std::vector<std::string>& command,
    const std::vector<std::pair<std::string, std::string>>& vars) {
  std::vector<std::string> out;
  for (std::string arg : command) {
    for (const auto& [name, value] : vars) {
      const std::string key = "{" + name + "}";
      for (size_t p = arg.find(key); p != std::string::npos; p = arg.find(key, p + value.size()))
        arg.replace(p, key.size(), value);
    }
    out.push_back(std::move(arg));
  }
  return out;
}

std::string NewReportFolder(const std::string& out_dir, const std::string& date) {
  std::error_code ec;
  const fs::path base(out_dir);
  if (!fs::exists(base / date, ec)) return (base / date).string();
  for (int n = 2;; ++n) {
    const fs::path p = base / (date + "-" + std::to_string(n));
    if (!fs::exists(p, ec)) return p.string();
  }
}

std::optional<std::string> FindPreviousReport(const std::string& out_dir,
                                              const std::string& exclude_folder) {
  std::error_code ec;
  std::optional<std::pair<std::string, int>> best;
  fs::path best_path;
  for (fs::directory_iterator it(out_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == exclude_folder) continue;
    const auto key = DatedFolder(name);
    if (!key || !fs::is_regular_file(it->path() / "report.json", ec)) continue;
    if (!best || *key > *best) best = key, best_path = it->path() / "report.json";
  }
  if (!best) return std::nullopt;
  return best_path.string();
}

std::vector<MetricChange> CompareSuiteReports(const Json& current, const Json* previous,
                                              double threshold_pct) {
  std::vector<MetricChange> out;
  if (!current.contains("models")) return out;
  for (const Json& model : current.at("models")) {
    const std::string name = model.value("name", "");
    const std::vector<Metric> peer = ModelMetrics(current, model, "peer");
    std::vector<Metric> prev;
    if (previous)
      if (const Json* pm = FindModel(*previous, name)) prev = ModelMetrics(*previous, *pm, "peng");
    for (const Metric& m : ModelMetrics(current, model, "peng")) {
      MetricChange c;
      c.model = name;
      c.id = m.id;
      c.label = m.label;
      c.higher_is_better = m.higher_is_better;
      c.value = m.value;
      c.peer = FindMetric(peer, m.id);
      c.previous = FindMetric(prev, m.id);
      if (c.previous && *c.previous > 0) {
        c.change_pct = (m.value - *c.previous) / *c.previous * 100;
        // "More than 5%": a change of exactly 5% that rounding put a hair beyond is not one.
        const double over = threshold_pct + 1e-9;
        c.regression = m.higher_is_better ? *c.change_pct < -over : *c.change_pct > over;
      }
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::string RenderSuiteMarkdown(const Json& current, const Json* previous,
                                const std::string& previous_path,
                                const std::vector<std::string>& plot_files) {
  const std::vector<MetricChange> rows = CompareSuiteReports(current, previous);
  const std::string peer = PeerName(current);
  const Json& machine = current.value("machine", Json::object());
  std::string md = "# peng benchmark report " + current.value("date", "") + "\n\n";
  md += "peng `" + Commit(current) + "`, " + machine.value("cpu", "unknown CPU") + ", " +
        std::to_string(machine.value("logical_cpus", 0)) + " logical CPUs, kernels " +
        machine.value("isa", "?") + ", " + std::to_string(current.value("threads", 0)) +
        " threads; the suite took " + Fmt("%.0f", current.value("duration_s", 0.0)) + " s.\n\n";
  if (previous) {
    md += "Compared with `" + previous_path + "` (" + previous->value("date", "undated") +
          ", peng `" + Commit(*previous) + "`).\n";
  } else {
    md += "No previous report: nothing to compare with.\n";
  }
  if (current.contains("peer")) {
    const Json& p = current.at("peer");
    if (p.value("ran", false))
      md += "Peer: " + peer + " on the same model files, threads and serving workload.\n";
    else
      md += "Peer " + p.value("name", "peer") + " not run: " + p.value("note", "") + "\n";
  }
  const Json& cfg = current.value("config", Json::object());
  SuiteConfig d;
  const Json& off = cfg.value("offline", Json::object());
  const Json& srv = cfg.value("serve", Json::object());
  md += "\nOffline: `peng bench`, one prefill of pp tokens and tg decode steps, median of " +
        std::to_string(off.value("reps", d.reps)) +
        " repetitions. Serving: `peng serve` (and the peer) driven like `peng bench serve` by c "
        "concurrent streaming clients sending " +
        std::to_string(srv.value("prompts_per_client", d.prompts_per_client)) +
        " x c requests of " + std::to_string(srv.value("input_len", d.input_len)) +
        " prompt words and " + std::to_string(srv.value("output_len", d.output_len)) +
        " output tokens (ignore_eos), all sent at once. Latencies in ms (lower is better); "
        "a change worse than " +
        Fmt("%g", kRegressionThresholdPct) + "% is flagged.\n";

  md += "\n## Regressions\n\n";
  int flagged = 0;
  for (const MetricChange& r : rows) {
    if (!r.regression) continue;
    ++flagged;
    md += "- **REGRESSION** " + r.model + " " + r.label + ": " + Num(*r.previous) + " -> " +
          Num(r.value) + " (" + Fmt("%+.1f%%", *r.change_pct) + ")\n";
  }
  if (flagged == 0) md += previous ? "None.\n" : "None (nothing to compare with).\n";

  for (const Json& model : current.value("models", Json::array())) {
    const std::string name = model.value("name", "");
    md += "\n## " + name + " (`" + model.value("path", "") + "`)\n\n";
    md += "| metric | peng | previous | change |";
    if (!peer.empty()) md += " " + peer + " | peng / " + peer + " |";
    md += "\n|---|---|---|---|" + std::string(peer.empty() ? "" : "---|---|") + "\n";
    int n = 0;
    for (const MetricChange& r : rows) {
      if (r.model != name) continue;
      ++n;
      std::string change;
      if (r.change_pct) change = Fmt("%+.1f%%", *r.change_pct);
      if (r.regression) change += " **REGRESSION**";
      md += "| " + r.label + " | " + Num(r.value) + " | " +
            (r.previous ? Num(*r.previous) : std::string("-")) + " | " + change + " |";
      if (!peer.empty()) {
        if (r.peer && *r.peer > 0)
          md += " " + Num(*r.peer) + " | " + Fmt("%.2f", r.value / *r.peer) + " |";
        else
          md += " | |";
      }
      md += "\n";
    }
    if (n == 0) md += "| (no results) | | | |" + std::string(peer.empty() ? "" : " | |") + "\n";
    // What the table cannot show: the bandwidth bound, failures.
    std::string notes;
    if (model.contains("offline")) {
      const Json& o = model.at("offline");
      if (o.contains("error")) {
        notes += "- offline benchmark failed: " + o.at("error").get<std::string>() + "\n";
      } else if (o.contains("weight_bytes_per_token")) {
        notes += "- weights read per token " +
                 Fmt("%.1f MB", o.at("weight_bytes_per_token").get<double>() / 1e6) +
                 ", read bandwidth " + Fmt("%.1f GB/s", o.value("mem_bandwidth_gbs", 0.0)) +
                 ": decode bound " +
                 Fmt("%.1f tok/s", o.value("bandwidth_bound_tokens_per_s", 0.0)) + "\n";
      }
    }
    for (const char* engine : {"peng", "peer"}) {
      if (!model.contains("serve") || !model.at("serve").contains(engine)) continue;
      const std::string who = std::string(engine) == "peng" ? "peng" : peer;
      for (const Json& run : model.at("serve").at(engine)) {
        const std::string c = std::to_string(run.value("concurrency", 0));
        if (run.contains("error")) {
          notes += "- " + who + ", c=" + c + ": " + run.at("error").get<std::string>() + "\n";
          continue;
        }
        const Json& s = run.at("summary");
        if (s.value("failed", int64_t{0}) > 0) {
          notes += "- " + who + ", c=" + c + ": " + std::to_string(s.value("failed", int64_t{0})) +
                   " of " + std::to_string(run.value("num_prompts", 0)) + " requests failed";
          if (s.contains("errors") && !s.at("errors").empty())
            notes += " (first: " + s.at("errors").at(0).get<std::string>() + ")";
          notes += "\n";
        }
      }
    }
    if (!notes.empty()) md += "\n" + notes;
  }
  if (!plot_files.empty()) {
    md += "\n## Plots\n\n";
    for (const std::string& f : plot_files) md += "![" + f + "](" + f + ")\n";
  }
  return md;
}

std::vector<std::pair<std::string, std::string>> RenderSuitePlots(const Json& current,
                                                                  const Json* previous) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string peer = PeerName(current);
  // Previous numbers only when the workload was the same (otherwise the lines mislead).
  const bool same_workload = previous && ServePrefix(*previous) == ServePrefix(current);
  for (const Json& model : current.value("models", Json::array())) {
    const std::string name = model.value("name", "");
    auto series = [&](const Json& m, const char* engine, const std::string& label,
                      const char* color, bool dashed) {
      LineSeries tput{label, color, dashed, {}}, ttft{label, color, dashed, {}};
      if (m.contains("serve") && m.at("serve").contains(engine))
        for (const Json& run : m.at("serve").at(engine)) {
          if (!run.contains("summary") || run.at("summary").value("completed", int64_t{0}) <= 0)
            continue;
          const double c = run.at("concurrency").get<int>();
          tput.points.emplace_back(c, run.at("summary").at("output_throughput").get<double>());
          ttft.points.emplace_back(c, run.at("summary").at("ttft_ms").at("median").get<double>());
        }
      return std::make_pair(tput, ttft);
    };
    LineChart tput{"Output throughput", "concurrent clients", "output tokens/s", true, {}};
    LineChart ttft{"Time to first token, median", "concurrent clients", "TTFT p50 (ms)", true, {}};
    auto add = [&](std::pair<LineSeries, LineSeries> s) {
      if (s.first.points.empty()) return;
      tput.series.push_back(std::move(s.first));
      ttft.series.push_back(std::move(s.second));
    };
    add(series(model, "peng", "peng", "#1f77b4", false));
    if (!peer.empty()) add(series(model, "peer", peer, "#ff7f0e", false));
    if (same_workload)
      if (const Json* pm = FindModel(*previous, name))
        add(series(*pm, "peng", "peng, previous (" + previous->value("date", "") + ")", "#888888",
                   true));
    if (tput.series.empty()) continue;
    const std::string title = "peng bench suite " + current.value("date", "") + ": " + name + ", " +
                              std::to_string(current.value("threads", 0)) + " threads";
    out.emplace_back(name + "-serve.svg", RenderLineCharts(title, {tput, ttft}));
  }
  return out;
}

}  // namespace peng::benchclient
