// peng logits: write the logits of every prompt position to a .npy file ([n_tokens, vocab],
// float32), for comparison with any reference implementation.
#include <cstdio>
#include <sstream>

#include <algorithm>

#include "engine/llm.h"
#include "kernels/ops.h"
#include "formats/npy_writer.h"
#include "tools/commands.h"

namespace peng::tools {
namespace {

struct LogitsArgs {
  LlmOptions llm;
  std::string prompt;
  std::string tokens;
  std::string out;
  bool exact = false;
};

StatusOr<std::vector<int32_t>> ParseIds(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const long v = std::stol(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      return InvalidArgument("--tokens: '" + item + "' is not a token id");
    }
  }
  if (ids.empty()) return InvalidArgument("--tokens: no token ids given");
  return ids;
}

int RunLogits(const LogitsArgs& a) {
  std::vector<int32_t> ids;
  if (!a.tokens.empty()) {
    auto parsed = ParseIds(a.tokens);
    if (!parsed.ok()) return Fail(parsed.status().ToString());
    ids = *parsed;
  }
  LlmOptions o = a.llm;
  if (a.exact && o.kv_dtype != DType::kF16)
    return Fail("--exact runs with an f32 KV cache; leave out --kv-cache-dtype");
  if (a.exact) {
    kernels::SetExactActivations(true);
    o.kv_dtype = DType::kF32;
  }
  o.max_model_len = std::max<int64_t>(o.max_model_len, static_cast<int64_t>(ids.size()));
  auto llm = Llm::Load(o);
  if (!llm.ok()) return Fail(llm.status().ToString());
  if (ids.empty()) {
    auto encoded = (*llm)->Encode(a.prompt);
    if (!encoded.ok()) return Fail(encoded.status().ToString());
    ids = *encoded;
  }
  auto logits = (*llm)->PromptLogits(ids);
  if (!logits.ok()) return Fail(logits.status().ToString());
  const int64_t V = (*llm)->model().config().vocab_size;
  Status s = WriteNpy(a.out, logits->data(), {static_cast<int64_t>(ids.size()), V});
  if (!s.ok()) return Fail(s.ToString());
  std::fprintf(stderr, "peng: wrote logits [%zu, %lld] to %s\n", ids.size(),
               static_cast<long long>(V), a.out.c_str());
  return 0;
}

}  // namespace

void RegisterLogits(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<LogitsArgs>();
  CLI::App* c = app.add_subcommand("logits", "Write the logits of every prompt position (.npy)");
  c->add_option("-m,--model", a->llm.model_path, "GGUF file or Hugging Face model folder")
      ->required();
  auto* p = c->add_option("--prompt", a->prompt, "Prompt text (tokenized with the model's BOS)");
  auto* t = c->add_option("--tokens", a->tokens, "Comma-separated token ids, e.g. 5,17,33");
  p->excludes(t);
  c->add_option("--out", a->out, "Output .npy file")->required();
  c->add_flag("--exact", a->exact,
              "FP32 activations and KV cache (no 8-bit activation quantization): for comparing "
              "with FP32 references");
  AddDeviceOptions(c, &a->llm.device, &a->llm.huge_pages);
  AddKvCacheDtypeOption(c, &a->llm.kv_dtype);
  c->add_option("-t,--threads", a->llm.threads, "Threads (0 = physical cores)")
      ->check(CLI::Range(0, 1024));
  c->callback([a, exit_code, p, t] {
    if (p->count() == 0 && t->count() == 0) {
      Fail("one of --prompt or --tokens is required");
      *exit_code = 2;  // a usage error
      return;
    }
    *exit_code = RunLogits(*a);
  });
}

}  // namespace peng::tools
