// moe_bench: decode and prefill speed of several models in one run, to show that a DeepSeek MoE
// layer costs what its *active* experts cost, not what all its experts cost. Intended inputs:
// small DeepSeek-V2-Lite-shaped files from make_deepseek_gguf that differ only in the expert
// count or top-k (hidden 2048, moe_intermediate 1408, 2 shared experts, every layer MoE):
//
//   G="build/bench/make_deepseek_gguf --layers 4 --dense 0 --vocab 4096"
//   $G -o out/moe-e64-k6.gguf --experts 64 --topk 6
//   $G -o out/moe-e160-k6.gguf --experts 160 --topk 6
//   $G -o out/moe-e64-k12.gguf --experts 64 --topk 12
//   build/bench/moe_bench -t 2 --pp 128 --tg 32 --reps 5 e64k6=out/moe-e64-k6.gguf
//       e160k6=out/moe-e160-k6.gguf e64k12=out/moe-e64-k12.gguf           (one command line)
//
// Every repetition loads each model in turn (one engine at a time, so no idle thread pool
// competes), warms it up with 2 decode steps, then times one prefill of --pp random tokens and
// --tg greedy decode steps from a 1-token context (peng bench's definitions). Prints per
// model the medians (min-max) in tokens/s, the weight bytes read per decoded token
// (Model::WeightBytesPerToken: attention, shared experts, router, top-k routed experts, LM
// head), and the ratios to the first model; --json FILE writes all samples.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/llm.h"

namespace peng {
namespace {

struct Entry {
  std::string label, path;
  std::vector<double> pp, tg;
  int64_t weight_bytes = 0;
  std::string summary;
};

struct Stats {
  double median = 0, min = 0, max = 0;
};

Stats Summarize(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  s.median = v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
  s.min = v.front();
  s.max = v.back();
  return s;
}

[[noreturn]] void Usage(const char* msg) {
  if (msg) std::fprintf(stderr, "moe_bench: %s\n", msg);
  std::fprintf(stderr,
               "usage: moe_bench [-t 2] [--pp 128] [--tg 32] [--reps 5] [--json OUT]\n"
               "                 LABEL=MODEL.gguf [LABEL=MODEL.gguf ...]\n");
  std::exit(2);
}

Status RunOne(Entry* e, int threads, int pp, int tg) {
  LlmOptions o;
  o.model_path = e->path;
  o.threads = threads;
  o.max_model_len = std::max(pp, tg) + 2;
  o.max_num_batched_tokens = std::max(pp, 1);
  PENG_ASSIGN_OR_RETURN(std::unique_ptr<Llm> llm, Llm::Load(o));
  e->weight_bytes = llm->model().WeightBytesPerToken();
  e->summary = llm->model().config().Summary();
  std::mt19937 rng(1234);
  const int64_t V = llm->model().config().vocab_size;
  std::vector<int32_t> prompt(pp);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % V);
  PENG_RETURN_IF_ERROR(llm->BenchDecode(2).status());  // warm-up
  if (pp > 0) {
    PENG_ASSIGN_OR_RETURN(double s, llm->BenchPrefill(prompt));
    e->pp.push_back(pp / s);
  }
  if (tg > 0) {
    PENG_ASSIGN_OR_RETURN(double s, llm->BenchDecode(tg));
    e->tg.push_back(tg / s);
  }
  return OkStatus();
}

int Main(int argc, char** argv) {
  int threads = 2, pp = 128, tg = 32, reps = 5;
  std::string json_out;
  std::vector<Entry> entries;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "-t" || a == "--threads") {
      threads = std::atoi(value().c_str());
    } else if (a == "--pp") {
      pp = std::atoi(value().c_str());
    } else if (a == "--tg") {
      tg = std::atoi(value().c_str());
    } else if (a == "--reps") {
      reps = std::atoi(value().c_str());
    } else if (a == "--json") {
      json_out = value();
    } else if (a == "-h" || a == "--help") {
      Usage(nullptr);
    } else if (a.find('=') != std::string::npos && a[0] != '-') {
      const size_t eq = a.find('=');
      Entry e;
      e.label = a.substr(0, eq);
      e.path = a.substr(eq + 1);
      entries.push_back(e);
    } else {
      Usage(("unknown argument " + a).c_str());
    }
  }
  if (entries.empty()) Usage("no models");
  if (threads < 0 || pp < 0 || tg < 0 || reps < 1 || (pp == 0 && tg == 0))
    Usage("bad --threads/--pp/--tg/--reps");

  for (int r = 0; r < reps; ++r) {
    for (Entry& e : entries) {
      if (Status s = RunOne(&e, threads, pp, tg); !s.ok()) {
        std::fprintf(stderr, "moe_bench: %s: %s\n", e.path.c_str(), s.ToString().c_str());
        return 1;
      }
    }
    std::fprintf(stderr, "rep %d/%d done\n", r + 1, reps);
  }

  std::printf("threads %d, pp%d, tg%d, %d reps (alternating), tokens/s median (min-max)\n", threads,
              pp, tg, reps);
  std::printf("%-10s %14s %24s %8s %24s %8s\n", "model", "MB/token", "pp", "vs 1st", "tg",
              "vs 1st");
  const Stats pp0 = Summarize(entries[0].pp), tg0 = Summarize(entries[0].tg);
  nlohmann::json j;
  j["threads"] = threads;
  j["pp_n"] = pp;
  j["tg_n"] = tg;
  j["reps"] = reps;
  for (const Entry& e : entries) {
    const Stats p = Summarize(e.pp), t = Summarize(e.tg);
    char pbuf[64], tbuf[64];
    std::snprintf(pbuf, sizeof pbuf, "%.1f (%.1f-%.1f)", p.median, p.min, p.max);
    std::snprintf(tbuf, sizeof tbuf, "%.2f (%.2f-%.2f)", t.median, t.min, t.max);
    std::printf("%-10s %14.1f %24s %8.3f %24s %8.3f\n", e.label.c_str(), e.weight_bytes / 1e6,
                pp > 0 ? pbuf : "-", pp > 0 ? p.median / pp0.median : 0.0, tg > 0 ? tbuf : "-",
                tg > 0 ? t.median / tg0.median : 0.0);
    j["models"].push_back({{"label", e.label},
                           {"path", e.path},
                           {"config", e.summary},
                           {"weight_bytes_per_token", e.weight_bytes},
                           {"pp", e.pp},
                           {"tg", e.tg},
                           {"pp_median", p.median},
                           {"tg_median", t.median}});
  }
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    f << j.dump(1) << "\n";
    if (!f) {
      std::fprintf(stderr, "moe_bench: cannot write %s\n", json_out.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace peng

int main(int argc, char** argv) { return peng::Main(argc, argv); }
