// peng generate: stream a completion of a prompt to stdout; timings to stderr.
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "core/cpu_features.h"
#include "engine/llm.h"
#include "kernels/isa.h"
#include "tools/commands.h"

namespace peng::tools {

void AddDeviceOptions(CLI::App* c, std::string* device, bool* huge_pages) {
  c->add_option("--device", *device,
                "Where the model runs: cpu (default), cuda or cuda:N (an NVIDIA GPU; docs/"
                "devices.md), host (the device graph on the CPU kernels)");
  c->add_flag("--huge-pages", *huge_pages,
              "Read the weight files into private transparent huge pages instead of mapping "
              "them in place (one-process CPU jobs whose files take at most a quarter of the "
              "available memory; the packed panels of Q4_0/Q4_1/Q8_0 use huge pages anyway)");
}

void AddKvCacheDtypeOption(CLI::App* c, DType* kv_dtype) {
  c->add_option_function<std::string>(
       "--kv-cache-dtype",
       [kv_dtype](const std::string& name) {
         std::string lower = name;
         for (char& ch : lower)
           ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
         *kv_dtype = KvCacheDtypes().at(lower);
       },
       "KV cache values: f16 (default), f32, or q8_0 (32-value blocks of int8 with an fp16 "
       "scale: about half the memory of f16; head dimensions multiples of 32)")
      ->check(CLI::IsMember({"f16", "f32", "q8_0"}, CLI::ignore_case));
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "peng: error: %s\n", what.c_str());
  return 1;
}

Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  if (!f) return IoError(path + ": cannot write");
  return OkStatus();
}

namespace {

struct GenerateArgs {
  LlmOptions llm;
  SamplingParams sp;
  std::string prompt;
  bool verbose = false;
  bool raw = false;
};

int RunGenerate(GenerateArgs& a) {
  if (a.verbose) {
    std::fprintf(stderr, "peng: cpu features: %s\n", GetCpuFeatures().ToString().c_str());
    std::fprintf(stderr, "peng: kernels: %s\n", kernels::IsaName(kernels::ActiveIsa()));
  }
  StatusOr<bool> worker = RunParallelWorker(Llm::CoreOptions(a.llm));
  if (!worker.ok()) return Fail(worker.status().ToString());
  if (*worker) return 0;  // a tensor-parallel rank > 0: rank 0 prints
  auto llm = Llm::Load(a.llm);
  if (!llm.ok()) return Fail(llm.status().ToString());
  Llm& m = **llm;
  if (a.verbose) {
    std::fprintf(stderr, "peng: model: %s\n", m.model().config().Summary().c_str());
    std::fprintf(stderr, "peng: weights: %s\n", m.model().WeightSummary().c_str());
    std::fprintf(stderr, "peng: threads: %d\n", m.pool().num_threads());
  }
  auto encoded = m.Encode(a.prompt);
  if (!encoded.ok()) return Fail(encoded.status().ToString());
  const std::vector<int32_t>& prompt = *encoded;
  if (!a.raw) std::fputs(a.prompt.c_str(), stdout);
  GenerateStats st;
  Status s = m.Generate(prompt, a.sp, [](int32_t, const std::string& text) {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    return true;
  }, &st);
  std::fputs("\n", stdout);
  if (!s.ok()) return Fail(s.ToString());
  std::fprintf(stderr,
               "peng: prompt: %lld tokens in %.3f s (%.1f tok/s); generation: %lld tokens in "
               "%.3f s (%.1f tok/s); finish: %s\n",
               static_cast<long long>(st.prompt_tokens), st.prompt_seconds,
               st.prompt_tokens / std::max(st.prompt_seconds, 1e-9),
               static_cast<long long>(st.generated_tokens), st.generate_seconds,
               st.generated_tokens / std::max(st.generate_seconds, 1e-9),
               st.finish_reason.c_str());
  return 0;
}

}  // namespace

void RegisterGenerate(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<GenerateArgs>();
  a->sp.max_tokens = 128;
  a->sp.temperature = 0.8f;
  CLI::App* c = app.add_subcommand("generate", "Generate text from a prompt");
  c->add_option("-m,--model", a->llm.model_path, "GGUF file or Hugging Face model folder")
      ->required();
  c->add_option("-p,--prompt", a->prompt, "Prompt text")->required();
  c->add_option("-n,--max-tokens", a->sp.max_tokens, "Tokens to generate")
      ->check(CLI::Range(1, 1 << 20));
  c->add_option("--temp,--temperature", a->sp.temperature, "Sampling temperature (0 = greedy)")
      ->check(CLI::Range(0.0, 100.0));
  c->add_option("--top-k", a->sp.top_k, "Top-k (0 = off)")->check(CLI::Range(-1, 1 << 30));
  c->add_option("--top-p", a->sp.top_p, "Top-p (nucleus)")->check(CLI::Range(0.0, 1.0));
  c->add_option("--min-p", a->sp.min_p, "Min-p")->check(CLI::Range(0.0, 1.0));
  c->add_option("--repeat-penalty", a->sp.repetition_penalty, "Repetition penalty (1 = off)");
  c->add_option("--presence-penalty", a->sp.presence_penalty, "Presence penalty");
  c->add_option("--frequency-penalty", a->sp.frequency_penalty, "Frequency penalty");
  c->add_option("--seed", a->sp.seed, "RNG seed (-1 = random)");
  c->add_option("--stop", a->sp.stop, "Stop string (repeatable)");
  c->add_option("-t,--threads", a->llm.threads, "Threads (0 = physical cores)")
      ->check(CLI::Range(0, 1024));
  AddDeviceOptions(c, &a->llm.device, &a->llm.huge_pages);
  AddKvCacheDtypeOption(c, &a->llm.kv_dtype);
  c->add_option("-c,--ctx-size", a->llm.max_model_len, "Context length")
      ->check(CLI::Range(1, 1 << 24));
  c->add_option("--tensor-parallel-size", a->llm.tensor_parallel_size,
                "Tensor-parallel ranks (-tp; run under mpirun -np N)")
      ->check(CLI::Range(1, 4096));
  c->add_option("--pipeline-parallel-size", a->llm.pipeline_parallel_size,
                "Pipeline stages (-pp; the layers split over them; mpirun -np tp*pp)")
      ->check(CLI::Range(1, 4096));
  c->add_flag("--enable-expert-parallel", a->llm.enable_expert_parallel,
              "MoE models under -tp: whole routed experts per rank instead of a slice of each");
  c->add_flag("--ignore-eos", a->sp.ignore_eos, "Keep generating after end-of-sequence");
  c->add_flag("--raw", a->raw, "Do not echo the prompt");
  c->add_flag("-v,--verbose", a->verbose, "Print CPU features, kernel ISA and model info");
  c->callback([a, exit_code] { *exit_code = RunGenerate(*a); });
}

}  // namespace peng::tools
