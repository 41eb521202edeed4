// peng bench suite: the monthly benchmark as one command. Reads a JSON configuration (models,
// threads, offline and serving workloads, optionally a peer server such as llama-server),
// runs for every model the offline benchmark of `peng bench` in this process and the serving
// benchmark of `peng bench serve` against `peng serve` (this same binary as a child process)
// and against the peer, and writes one dated report folder: report.json, summary.md compared
// with the previous report (regressions flagged) and SVG plots. The configuration, the
// comparison and the rendering live in src/benchclient/suite_report.{h,cc}; this file runs the
// benchmarks and the processes.
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "benchclient/report.h"
#include "benchclient/runner.h"
#include "benchclient/suite_report.h"
#include "core/cpu_features.h"
#include "core/mapped_file.h"
#include "kernels/isa.h"
#include "tools/commands.h"

namespace peng::tools {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;
using benchclient::SuiteConfig;

struct SuiteArgs {
  std::string config_path;
  std::string compare_path;  // empty: the newest other report in out_dir
  std::string out_dir;       // overrides the configuration's
  bool no_peer = false;
};

// How long a server gets to exit after SIGTERM (peng drains; nothing is running by then).
constexpr double kStopTimeoutS = 30;

StatusOr<Json> ReadJson(const std::string& path) {
  PENG_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("models"))
    return InvalidArgument(path + ": not a peng bench suite report");
  return j;
}

// stdout of a shell command, trailing newline removed; "" when it fails.
std::string CommandOutput(const std::string& cmd) {
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  if (pclose(p) != 0) return "";
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
  }
  return "unknown CPU";
}

// The commit of the checkout we run in (the benchmark is run from the repository root), with
// "+dirty" when tracked files differ from it: then the binary may not be exactly that commit.
std::string GitCommit() {
  const std::string head = CommandOutput("git rev-parse --short=12 HEAD 2>/dev/null");
  if (head.empty()) return "unknown";
  const std::string dirty =
      CommandOutput("git status --porcelain --untracked-files=no 2>/dev/null | head -1");
  return dirty.empty() ? head : head + "+dirty";
}

std::string Now(const char* fmt) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char b[64];
  std::strftime(b, sizeof b, fmt, &tm);
  return b;
}

// A loopback port nobody listens on now: bind port 0 and let the kernel choose.
StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError(std::string("socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const std::string err = std::strerror(errno);
    close(fd);
    return IoError("cannot find a free port: " + err);
  }
  close(fd);
  return static_cast<int>(ntohs(a.sin_port));
}

// argv[0] as execvp would find it: a path containing '/' as is, else searched in $PATH.
std::optional<std::string> FindExecutable(const std::string& program) {
  if (program.find('/') != std::string::npos)
    return access(program.c_str(), X_OK) == 0 ? std::optional(program) : std::nullopt;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string p = (dir.empty() ? "." : dir) + "/" + program;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return std::nullopt;
}

std::string LogTail(const std::string& path, size_t lines = 8) {
  std::ifstream f(path);
  std::vector<std::string> all;
  std::string line;
  while (std::getline(f, line)) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += "\n    " + all[i];
  return out;
}

// A server child process: started with its output in a log file, stopped with SIGTERM (and
// SIGKILL if it does not exit in time). The destructor stops it, so that no error path of the
// suite leaves a server running; PR_SET_PDEATHSIG covers the suite itself being killed.
class ServerProcess {
 public:
  ServerProcess(std::string name, std::string log_path)
      : name_(std::move(name)), log_path_(std::move(log_path)) {}
  ~ServerProcess() {
    if (pid_ > 0) (void)Stop();
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  Status Start(const std::vector<std::string>& argv) {
    const int log = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log < 0) return IoError(log_path_ + ": " + std::strerror(errno));
    // Everything the child needs is prepared before fork(): after it only async-signal-safe
    // calls are allowed (the suite may have threads).
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      close(log);
      if (devnull >= 0) close(devnull);
      return IoError(std::string("fork: ") + std::strerror(errno));
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(127);  // the suite died before prctl
      if (devnull >= 0) dup2(devnull, 0);
      dup2(log, 1);
      dup2(log, 2);
      execvp(args[0], args.data());
      static const char msg[] = "peng bench suite: exec failed\n";
      (void)!write(2, msg, sizeof msg - 1);
      _exit(127);
    }
    close(log);
    if (devnull >= 0) close(devnull);
    pid_ = pid;
    return OkStatus();
  }

  // Polls GET /health until 200, the process exits, or the timeout.
  Status WaitHealthy(int port, double timeout_s) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    httplib::Client cli("127.0.0.1", port);
    cli.set_connection_timeout(1, 0);
    cli.set_read_timeout(5, 0);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return Internal(name_ + " exited (" + Describe(status) + ") before /health answered; " +
                        log_path_ + ":" + LogTail(log_path_));
      }
      if (auto r = cli.Get("/health"); r && r->status == 200) return OkStatus();
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return Internal(name_ + ": /health did not answer 200 within " +
                    std::to_string(static_cast<int>(timeout_s)) + " s; " + log_path_ + ":" +
                    LogTail(log_path_));
  }

  // SIGTERM, then SIGKILL after kStopTimeoutS. OK when it exited by itself in time.
  Status Stop() {
    if (pid_ <= 0) return OkStatus();
    kill(pid_, SIGTERM);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(kStopTimeoutS);
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return OkStatus();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return Internal(name_ + " did not exit within " + std::to_string(int(kStopTimeoutS)) +
                    " s of SIGTERM: killed");
  }

 private:
  static std::string Describe(int status) {
    if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return std::string("signal ") + strsignal(WTERMSIG(status));
    return "status " + std::to_string(status);
  }

  std::string name_;
  std::string log_path_;
  pid_t pid_ = -1;
};

// One server (peng or the peer) for one model: start, every concurrency, stop. Returns the
// runs (one per concurrency; each an error entry when the server could not be used).
Json ServeRuns(const SuiteConfig& cfg, const std::string& who, const std::string& model_name,
               const std::vector<std::string>& argv, int port, const std::string& log_path,
               bool* failed) {
  Json runs = Json::array();
  auto fail_all = [&](const std::string& error) {
    std::fprintf(stderr, "  %s: %s\n", who.c_str(), error.c_str());
    *failed = true;
    for (int c : cfg.concurrency) runs.push_back({{"concurrency", c}, {"error", error}});
    return runs;
  };
  std::string cmdline;
  for (const std::string& a : argv) cmdline += (cmdline.empty() ? "" : " ") + a;
  std::fprintf(stderr, "[%s] %s: %s\n", model_name.c_str(), who.c_str(), cmdline.c_str());
  ServerProcess server(who, log_path);
  if (Status s = server.Start(argv); !s.ok()) return fail_all(s.message());
  if (Status s = server.WaitHealthy(port, cfg.health_timeout_s); !s.ok())
    return fail_all(s.message());

  benchclient::BenchConfig bc;
  bc.client.url = "http://127.0.0.1:" + std::to_string(port);
  bc.client.endpoint = "/v1/completions";
  bc.client.timeout_s = cfg.request_timeout_s;
  bc.client.ignore_eos = true;
  bc.input_len = cfg.input_len;
  bc.output_len = cfg.output_len;
  bc.seed = cfg.seed;
  {
    auto client = benchclient::OpenAiClient::Create(bc.client);
    if (!client.ok()) return fail_all(client.status().message());
    auto id = (*client)->FirstModelId();
    if (!id.ok()) return fail_all("GET /v1/models: " + id.status().message());
    bc.client.model = *id;
    // One short request first: the server's first request pays one-time costs.
    const benchclient::RequestResult probe = (*client)->Stream("Hello, how are you?", 4);
    if (!probe.ok) return fail_all("test request failed: " + probe.error);
  }
  for (int c : cfg.concurrency) {
    bc.max_concurrency = c;
    bc.num_prompts = cfg.prompts_per_client * c;
    const benchclient::BenchRun run = benchclient::RunBenchmark(bc);
    const Json report = benchclient::BuildReport(bc, run);
    const Json& s = report["summary"];
    std::fprintf(stderr, "  %s c=%d: %lld/%d ok, %.1f output tok/s, TTFT p50 %.0f ms\n",
                 who.c_str(), c, static_cast<long long>(s["completed"].get<int64_t>()),
                 bc.num_prompts, s["output_throughput"].get<double>(),
                 s["ttft_ms"]["median"].get<double>());
    if (s["failed"].get<int64_t>() > 0) *failed = true;
    runs.push_back({{"concurrency", c}, {"num_prompts", bc.num_prompts}, {"summary", s}});
  }
  if (Status s = server.Stop(); !s.ok()) {
    std::fprintf(stderr, "  %s: %s\n", who.c_str(), s.message().c_str());
    *failed = true;
  }
  return runs;
}

int RunSuite(const SuiteArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string date = Now("%Y-%m-%d"), started = Now("%Y-%m-%dT%H:%M:%S");
  Json raw;
  StatusOr<SuiteConfig> loaded = benchclient::LoadSuiteConfig(a.config_path, &raw);
  if (!loaded.ok()) {
    std::fprintf(stderr, "peng: error: %s\n", loaded.status().message().c_str());
    return 2;
  }
  SuiteConfig cfg = *loaded;
  if (!a.out_dir.empty()) cfg.out_dir = a.out_dir;
  if (cfg.threads == 0) cfg.threads = GetCpuFeatures().physical_cores;

  // The report compared with: --compare, else the newest one already in out_dir.
  std::optional<Json> previous;
  std::string previous_path;
  if (!a.compare_path.empty()) {
    previous_path = a.compare_path;
    if (fs::is_directory(previous_path))
      previous_path = (fs::path(previous_path) / "report.json").string();
    StatusOr<Json> p = ReadJson(previous_path);
    if (!p.ok()) {
      std::fprintf(stderr, "peng: error: --compare: %s\n", p.status().message().c_str());
      return 2;
    }
    previous = std::move(*p);
  } else if (auto found = benchclient::FindPreviousReport(cfg.out_dir)) {
    StatusOr<Json> p = ReadJson(*found);
    if (p.ok()) {
      previous = std::move(*p);
      previous_path = *found;
    } else {
      std::fprintf(stderr, "warning: %s: not compared\n", p.status().message().c_str());
    }
  }

  // The peer is optional: without its binary the suite says so and runs without it.
  Json peer_info;
  std::optional<std::string> peer_exe;
  if (cfg.peer) {
    peer_info = {{"name", cfg.peer->name}, {"ran", false}};
    if (a.no_peer) {
      peer_info["note"] = "--no-peer was given.";
    } else if (!(peer_exe = FindExecutable(cfg.peer->command[0]))) {
      peer_info["note"] = cfg.peer->command[0] +
                          " was not found (bench/build_llama_server.sh builds llama-server).";
    }
    if (peer_info.contains("note"))
      std::fprintf(stderr, "peer %s skipped: %s\n", cfg.peer->name.c_str(),
                   peer_info["note"].get<std::string>().c_str());
  }

  std::error_code ec;
  const std::string folder = benchclient::NewReportFolder(cfg.out_dir, date);
  fs::create_directories(folder, ec);
  if (ec) return Fail(folder + ": cannot create: " + ec.message());
  char tmpl[] = "/tmp/peng-bench-suite-XXXXXX";
  const char* logs = mkdtemp(tmpl);
  if (!logs)
    return Fail(std::string("cannot create a log folder in /tmp: ") + std::strerror(errno));
  std::fprintf(stderr,
               "peng bench suite: %zu models, %d threads; report folder %s; server logs in %s\n",
               cfg.models.size(), cfg.threads, folder.c_str(), logs);
  if (previous) std::fprintf(stderr, "comparing with %s\n", previous_path.c_str());

  const std::string self = fs::read_symlink("/proc/self/exe", ec).string();
  bool failed = false;
  Json models = Json::array();
  for (const benchclient::SuiteModel& m : cfg.models) {
    Json entry = {{"name", m.name}, {"path", m.path}};
    if (cfg.pp > 0 || cfg.tg > 0) {
      std::fprintf(stderr, "[%s] offline: pp%d tg%d x %d, %d threads\n", m.name.c_str(), cfg.pp,
                   cfg.tg, cfg.reps, cfg.threads);
      StatusOr<Json> off = RunOfflineBench({m.path, cfg.threads, cfg.pp, cfg.tg, cfg.reps});
      if (off.ok()) {
        entry["offline"] = *off;
      } else {
        std::fprintf(stderr, "  offline: %s\n", off.status().ToString().c_str());
        entry["offline"] = {{"error", off.status().ToString()}};
        failed = true;
      }
    }
    if (!cfg.concurrency.empty()) {
      Json serve = Json::object();
      const std::string max_len = std::to_string(cfg.max_model_len());
      const std::string slots = std::to_string(cfg.max_concurrency());
      auto port = FreePort();
      if (!port.ok()) return Fail(port.status().message());
      serve["peng"] = ServeRuns(
          cfg, "peng serve", m.name,
          {self.empty() ? std::string("/proc/self/exe") : self, "serve", m.path, "--host",
           "127.0.0.1", "--port", std::to_string(*port), "--threads", std::to_string(cfg.threads),
           "--max-num-seqs", slots, "--max-model-len", max_len},
          *port, std::string(logs) + "/" + m.name + "-peng.log", &failed);
      if (peer_exe) {
        port = FreePort();
        if (!port.ok()) return Fail(port.status().message());
        const std::vector<std::string> argv = benchclient::ExpandCommand(
            cfg.peer->command,
            {{"model", m.path},
             {"port", std::to_string(*port)},
             {"threads", std::to_string(cfg.threads)},
             {"slots", slots},
             {"max_model_len", max_len},
             {"ctx", std::to_string(int64_t{cfg.max_concurrency()} * cfg.max_model_len())}});
        serve["peer"] = ServeRuns(cfg, cfg.peer->name, m.name, argv, *port,
                                  std::string(logs) + "/" + m.name + "-peer.log", &failed);
      }
      entry["serve"] = std::move(serve);
    }
    models.push_back(std::move(entry));
  }
  if (peer_exe) peer_info["ran"] = true;

  Json report = {{"format", "peng-bench-suite/1"},
                 {"date", date},
                 {"started", started},
                 {"threads", cfg.threads},
                 {"machine",
                  {{"cpu", CpuModel()},
                   {"cpu_features", GetCpuFeatures().ToString()},
                   {"logical_cpus", GetCpuFeatures().logical_cores},
                   {"isa", kernels::IsaName(kernels::ActiveIsa())},
                   {"git_commit", GitCommit()}}},
                 {"config", raw},
                 {"models", std::move(models)}};
  if (cfg.peer) report["peer"] = peer_info;
  report["duration_s"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // A previous report of another shape (hand-edited, older format) is not compared, rather
  // than stopping the suite after all its work.
  const Json* prev = previous ? &*previous : nullptr;
  std::vector<std::pair<std::string, std::string>> plots;
  std::string md;
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      plots = benchclient::RenderSuitePlots(report, prev);
      std::vector<std::string> names;
      for (const auto& p : plots) names.push_back(p.first);
      md = benchclient::RenderSuiteMarkdown(report, prev, previous_path, names);
      break;
    } catch (const nlohmann::json::exception& e) {
      if (!prev) return Fail(std::string("rendering the report: ") + e.what());
      std::fprintf(stderr, "warning: %s has an unexpected shape (%s): not compared\n",
                   previous_path.c_str(), e.what());
      prev = nullptr;
    }
  }
  if (prev) report["compared_with"] = previous_path;
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"report.json", report.dump(2) + "\n"}, {"summary.md", md}}) {
    if (Status s = WriteFile(folder + "/" + name, text); !s.ok()) return Fail(s.ToString());
  }
  for (const auto& [name, svg] : plots)
    if (Status s = WriteFile(folder + "/" + name, svg); !s.ok()) return Fail(s.ToString());
  std::fputs(md.c_str(), stdout);
  std::fprintf(stderr, "report written to %s (%.0f s)\n", folder.c_str(),
               report["duration_s"].get<double>());
  return failed ? 1 : 0;
}

}  // namespace

CLI::App* RegisterBenchSuite(CLI::App& bench, int* exit_code) {
  auto a = std::make_shared<SuiteArgs>();
  CLI::App* s = bench.add_subcommand(
      "suite",
      "The monthly benchmark: offline and serving benchmarks over several models (optionally "
      "against a peer server), written to a dated report folder");
  s->add_option("--config", a->config_path, "JSON configuration (see bench/suite.json)")
      ->required();
  s->add_option("--compare", a->compare_path,
                "Report (folder or report.json) to compare with (default: the newest other "
                "dated report in out_dir)");
  s->add_option("--out-dir", a->out_dir, "Write the report folder here instead of out_dir");
  s->add_flag("--no-peer", a->no_peer, "Do not run the peer server even if configured");
  s->callback([a, exit_code] { *exit_code = RunSuite(*a); });
  return s;
}

}  // namespace peng::tools
