// peng top: a live terminal monitor of peng servers in the spirit of npu-smi / nvtop. One
// row per replica URL, redrawn every --interval seconds: state (healthy / draining / down),
// running and waiting requests, KV-cache use and prefix hit rate, prompt and generation
// tokens/s, read-bandwidth and compute utilization, TTFT and ITL p50/p99 over the last minute
// and a sparkline of the generation rate. It reads only /health and /metrics, so it works
// across hosts. --once prints one table (or --json) after two scrapes --interval apart.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>

#include "monitor/replica.h"
#include "tools/commands.h"

namespace peng::tools {
namespace {

struct TopArgs {
  std::vector<std::string> urls;
  double interval_s = 1.0;
  double timeout_s = 1.0;
  bool once = false;
  bool json = false;
  int iterations = 0;  // 0 = until Ctrl-C
};

std::atomic<bool> g_stop{false};

void PollAll(std::vector<monitor::ReplicaMonitor>& mons, double t) {
  // Scrape the replicas in parallel: one dead host must not delay the others' rows.
  std::vector<std::thread> threads;
  for (auto& m : mons) threads.emplace_back([&m, t] { m.Poll(t); });
  for (auto& th : threads) th.join();
}

int RunTop(const TopArgs& a) {
  std::vector<monitor::ReplicaMonitor> mons;
  for (const std::string& u : a.urls) mons.emplace_back(u, a.timeout_s);
  const auto start = std::chrono::steady_clock::now();
  auto now = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto sleep_until = [&](double t) {
    while (!g_stop && now() < t) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  auto rows = [&] {
    std::vector<monitor::ReplicaRow> r;
    for (const auto& m : mons) r.push_back(m.Row());
    return r;
  };
  if (a.once) {  // two scrapes, so that rates exist
    PollAll(mons, now());
    sleep_until(a.interval_s);
    PollAll(mons, now());
    if (a.json) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& r : rows()) out.push_back(r.ToJson());
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      std::fputs(monitor::RenderTable(rows(), false).c_str(), stdout);
    }
    return 0;
  }
  std::signal(SIGINT, [](int) { g_stop = true; });
  std::signal(SIGTERM, [](int) { g_stop = true; });
  const bool tty = isatty(fileno(stdout));
  std::fputs(tty ? "\x1b[?25l" : "", stdout);  // hide the cursor while drawing
  for (int i = 0; !g_stop && (a.iterations == 0 || i < a.iterations); ++i) {
    const double t = i * a.interval_s;
    sleep_until(t);
    if (g_stop) break;
    PollAll(mons, now());
    std::string screen = tty ? "\x1b[H\x1b[2J" : "";
    char head[128];
    std::snprintf(head, sizeof(head), "peng top - %zu replica(s), every %.1f s, Ctrl-C quits\n\n",
                  mons.size(), a.interval_s);
    screen += head;
    screen += monitor::RenderTable(rows(), tty);
    if (!tty) screen += "\n";
    std::fputs(screen.c_str(), stdout);
    std::fflush(stdout);
  }
  std::fputs(tty ? "\x1b[?25h" : "", stdout);
  return 0;
}

}  // namespace

void RegisterTop(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<TopArgs>();
  CLI::App* c = app.add_subcommand(
      "top", "Live monitor of peng servers (reads their /health and /metrics)");
  c->add_option("urls", a->urls, "Server base URLs, e.g. http://10.0.0.5:8000")
      ->required();
  c->add_option("--interval", a->interval_s, "Seconds between refreshes")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  c->add_option("--timeout", a->timeout_s, "Seconds a scrape may take before the replica is down")
      ->check(CLI::Range(0.05, 60.0))
      ->capture_default_str();
  c->add_flag("--once", a->once, "Print one table after two scrapes --interval apart, then exit");
  c->add_flag("--json", a->json, "With --once: print the rows as JSON");
  c->add_option("--iterations", a->iterations, "Refreshes before exiting (0 = until Ctrl-C)")
      ->check(CLI::NonNegativeNumber);
  c->callback([a, exit_code] {
    if (a->json && !a->once) {
      std::fprintf(stderr, "peng: error: --json needs --once\n");
      *exit_code = 2;
      return;
    }
    *exit_code = RunTop(*a);
  });
}

}  // namespace peng::tools
