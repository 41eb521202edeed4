// peng eval ppl | compare: perplexity of a model over a text file (strided sliding windows),
// and a comparison of a model against a reference model (or against itself in exact FP32
// activation mode) over the same windows. The math and the window scheme are in
// src/engine/eval.h. The text is tokenized once, whole, with the model's default BOS
// handling (a BOS at the start for models whose tokenizer adds one, e.g. Gemma); only the
// first window therefore starts with BOS, and token 0 is never scored.
#include <cstdio>
#include <fstream>
#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/diagnose.h"
#include "engine/eval.h"
#include "engine/llm.h"
#include "kernels/ops.h"
#include "tools/commands.h"

namespace peng::tools {
namespace {

struct EvalArgs {
  std::string model, reference, text;
  int64_t ctx = 512, stride = 256, max_tokens = 0;
  std::string device = "cpu";
  std::string reference_device;  // (compare; empty: --device)
  int threads = 0;
  bool huge_pages = false;
  bool exact = false, exact_reference = false, json = false, diagnose = false;
  DType kv_dtype = DType::kF16;  // --kv-cache-dtype of --model (the reference keeps f16)
  double max_deviation = 0.03, max_weight_deviation = 0.10;
};

StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound("cannot open text file " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  if (ss.str().empty()) return InvalidArgument("text file " + path + " is empty");
  return ss.str();
}

// `path` with an F32 KV cache when exact, else one of kv_dtype.
StatusOr<std::unique_ptr<Llm>> LoadModel(const std::string& path, const std::string& device,
                                         const EvalArgs& a, bool exact, DType kv_dtype) {
  LlmOptions o;
  o.model_path = path;
  o.device = device;
  o.huge_pages = a.huge_pages;
  o.threads = a.threads;
  o.max_model_len = a.ctx;
  o.kv_dtype = exact ? DType::kF32 : kv_dtype;
  return Llm::Load(o);
}

// Logits of one window with exact activations on or off for the duration of the call.
eval::LogitsFn Runner(Llm& llm, bool exact) {
  return [&llm, exact](std::span<const int32_t> ids) {
    kernels::SetExactActivations(exact);
    auto out = llm.PromptLogits(ids);
    kernels::SetExactActivations(false);
    return out;
  };
}

// Tokens of the text under `llm`, truncated to --max-tokens; also clamps a.ctx to the model.
StatusOr<std::vector<int32_t>> Tokens(Llm& llm, EvalArgs& a) {
  auto text = ReadText(a.text);
  if (!text.ok()) return text.status();
  auto ids = llm.Encode(*text);
  if (!ids.ok()) return ids.status();
  if (a.max_tokens > 0 && static_cast<int64_t>(ids->size()) > a.max_tokens) {
    ids->resize(a.max_tokens);
  }
  if (ids->size() < 2) return InvalidArgument("text has fewer than 2 tokens");
  if (a.ctx > llm.max_model_len()) {
    std::fprintf(stderr, "peng: --ctx %lld capped to the model's %lld\n",
                 static_cast<long long>(a.ctx), static_cast<long long>(llm.max_model_len()));
    a.ctx = llm.max_model_len();
  }
  return ids;
}

int RunPpl(EvalArgs a) {
  if (a.exact) kernels::SetExactActivations(true);  // before loading: any load-time choices
  if (a.exact && a.kv_dtype != DType::kF16)
    return Fail("--exact runs with an f32 KV cache; leave out --kv-cache-dtype");
  auto llm = LoadModel(a.model, a.device, a, a.exact, a.kv_dtype);
  kernels::SetExactActivations(false);
  if (!llm.ok()) return Fail(llm.status().ToString());
  auto ids = Tokens(**llm, a);
  if (!ids.ok()) return Fail(ids.status().ToString());
  const int64_t vocab = (*llm)->model().config().vocab_size;
  auto r = eval::Perplexity(*ids, a.ctx, a.stride, vocab, Runner(**llm, a.exact));
  if (!r.ok()) return Fail(r.status().ToString());
  if (a.json) {
    nlohmann::json j = {{"model", a.model},          {"text", a.text},
                        {"tokens", ids->size()},      {"ctx", a.ctx},
                        {"stride", a.stride},         {"exact", a.exact},
                        {"kv_cache_dtype", KvCacheDtypeName(a.exact ? DType::kF32 : a.kv_dtype)},
                        {"tokens_scored", r->tokens_scored}, {"mean_nll", r->MeanNll()},
                        {"ppl", r->Ppl()}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("tokens: %zu (ctx %lld, stride %lld%s)\n", ids->size(),
                static_cast<long long>(a.ctx), static_cast<long long>(a.stride),
                a.exact ? ", exact" : "");
    std::printf("tokens scored: %lld\nmean NLL: %.6f\nPPL: %.4f\n",
                static_cast<long long>(r->tokens_scored), r->MeanNll(), r->Ppl());
  }
  return 0;
}

int RunCompare(EvalArgs a) {
  auto model = LoadModel(a.model, a.device, a, false, a.kv_dtype);
  if (!model.ok()) return Fail(model.status().ToString());
  auto ref = LoadModel(a.reference, a.reference_device.empty() ? a.device : a.reference_device, a,
                       a.exact_reference, DType::kF16);
  if (!ref.ok()) return Fail(ref.status().ToString());
  const int64_t vocab = (*model)->model().config().vocab_size;
  if ((*ref)->model().config().vocab_size != vocab) {
    return Fail("model and reference have different vocabularies (" + std::to_string(vocab) +
                " vs " + std::to_string((*ref)->model().config().vocab_size) + " tokens)");
  }
  auto ids = Tokens(**model, a);
  if (!ids.ok()) return Fail(ids.status().ToString());
  auto ref_ids = Tokens(**ref, a);
  if (!ref_ids.ok()) return Fail(ref_ids.status().ToString());
  if (*ids != *ref_ids) return Fail("model and reference tokenize the text differently");
  auto r = eval::Compare(*ids, a.ctx, a.stride, vocab, Runner(**model, false),
                         Runner(**ref, a.exact_reference));
  if (!r.ok()) return Fail(r.status().ToString());
  const Tokenizer* tok = (*model)->tokenizer();
  const std::string target = tok->TokenText(r->worst_target);
  const std::string worst = tok->TokenText(r->worst_vocab);
  // Same-named weight matrices of the two models, compared directly (a corrupted scale shows up
  // here by an order of magnitude even when the outputs move only a few percent).
  const std::vector<eval::TensorDeviation> weights =
      eval::CompareWeights((*model)->model(), (*ref)->model(), &(*model)->pool());
  const bool output_failed = r->MeanDeviation() > a.max_deviation;
  const bool weight_failed = !weights.empty() && weights[0].rel > a.max_weight_deviation;
  const bool failed = output_failed || weight_failed;
  // Localise the disagreement on the window that ends at the worst position.
  std::optional<eval::Diagnosis> diag;
  if (failed || a.diagnose) {
    const int64_t end = std::max<int64_t>(r->worst_position, 2);
    const int64_t begin = std::max<int64_t>(0, end - a.ctx);
    auto d = eval::DiagnoseLayers(**model, **ref, std::span(*ids).subspan(begin, end - begin),
                                  a.exact_reference);
    if (!d.ok()) return Fail(d.status().ToString());
    diag = std::move(*d);
  }
  auto layer_name = [](int il) { return "blk." + std::to_string(il); };
  if (a.json) {
    nlohmann::json j = {{"model", a.model},
                        {"reference", a.reference},
                        {"exact_reference", a.exact_reference},
                        {"tokens_scored", r->tokens_scored},
                        {"mean_kl", r->MeanKl()},
                        {"top1_agreement", r->Top1Agreement()},
                        {"ppl_model", r->PplModel()},
                        {"ppl_reference", r->PplRef()},
                        {"ppl_ratio", r->PplRatio()},
                        {"mean_deviation", r->MeanDeviation()},
                        {"max_deviation", r->max_deviation},
                        {"max_allowed_deviation", a.max_deviation},
                        {"passed", !failed},
                        {"worst_position", r->worst_position},
                        {"worst_target_id", r->worst_target},
                        {"worst_vocab_id", r->worst_vocab}};
    j["max_allowed_weight_deviation"] = a.max_weight_deviation;
    nlohmann::json t = nlohmann::json::array();
    for (size_t i = 0; i < weights.size() && i < 5; ++i)
      t.push_back({{"name", weights[i].name}, {"relative_error", weights[i].rel}});
    j["worst_tensors"] = t;
    if (diag) {
      j["layer_deviation"] = diag->layer_rel;
      if (diag->worst_layer >= 0) j["worst_layer"] = layer_name(diag->worst_layer);
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("tokens scored: %lld (ctx %lld, stride %lld)\n",
                static_cast<long long>(r->tokens_scored), static_cast<long long>(a.ctx),
                static_cast<long long>(a.stride));
    std::printf("mean KL(ref||model): %.6f nats/token\n", r->MeanKl());
    std::printf("top-1 agreement: %.2f%%\n", 100 * r->Top1Agreement());
    std::printf("PPL model: %.4f  reference: %.4f  ratio: %.5f\n", r->PplModel(), r->PplRef(),
                r->PplRatio());
    std::printf("relative logit deviation: mean %.4f (limit %.4f), max %.4f at position %lld "
                "(target %d '%s', largest difference at vocab id %d '%s')\n",
                r->MeanDeviation(), a.max_deviation, r->max_deviation,
                static_cast<long long>(r->worst_position), r->worst_target, target.c_str(),
                r->worst_vocab, worst.c_str());
    if (diag) {
      std::printf("residual-stream deviation by layer (window ending at position %lld):",
                  static_cast<long long>(r->worst_position));
      for (size_t l = 0; l < diag->layer_rel.size(); ++l)
        std::printf("%s%s %.4f", l ? "," : "", l ? layer_name(int(l) - 1).c_str() : " embd",
                    diag->layer_rel[l]);
      std::printf("\n");
    }
    if (weights.empty()) {
      std::printf("weights: no matrices with the same name and shape in both models\n");
    } else {
      std::printf("weights: %zu matrices compared, largest relative errors (limit %.4f):",
                  weights.size(), a.max_weight_deviation);
      for (size_t i = 0; i < weights.size() && i < 3; ++i)
        std::printf("%s %s %.5f", i ? "," : "", weights[i].name.c_str(), weights[i].rel);
      std::printf("\n");
    }
  }
  if (failed) {
    std::string what = output_failed
        ? "mean relative logit deviation " + std::to_string(r->MeanDeviation()) +
              " exceeds --max-deviation " + std::to_string(a.max_deviation) +
              " (worst at token position " + std::to_string(r->worst_position) + ")"
        : "outputs within --max-deviation (" + std::to_string(r->MeanDeviation()) + ")";
    if (diag && diag->worst_layer >= 0)
      what += "; the error grows most in layer " + layer_name(diag->worst_layer) + " (+" +
              std::to_string(diag->worst_layer_growth) + " relative)";
    if (!weights.empty())
      what += std::string(weight_failed ? "; tensor " : "; largest weight error in ") +
              weights[0].name + " (relative error " + std::to_string(weights[0].rel) +
              (weight_failed ? " exceeds --max-weight-deviation " +
                                   std::to_string(a.max_weight_deviation)
                             : std::string()) +
              ")";
    std::fprintf(stderr, "peng: error: %s\n", what.c_str());
    return 1;
  }
  return 0;
}

void AddCommon(CLI::App* c, EvalArgs* a) {
  c->add_option("-m,--model", a->model, "GGUF file or Hugging Face model folder")->required();
  c->add_option("--text", a->text, "UTF-8 text file to evaluate on")->required();
  c->add_option("--ctx", a->ctx, "Tokens per window")->check(CLI::Range(2, 1 << 20));
  c->add_option("--stride", a->stride, "Tokens each window advances (clamped to ctx - 1)")
      ->check(CLI::Range(1, 1 << 20));
  c->add_option("--max-tokens", a->max_tokens, "Use only the first N tokens (0 = all)")
      ->check(CLI::Range(0, 1 << 30));
  c->add_option("-t,--threads", a->threads, "Threads (0 = physical cores)")
      ->check(CLI::Range(0, 1024));
  c->add_flag("--json", a->json, "Print JSON");
  AddDeviceOptions(c, &a->device, &a->huge_pages);
  AddKvCacheDtypeOption(c, &a->kv_dtype);
}

}  // namespace

void RegisterEval(CLI::App& app, int* exit_code) {
  CLI::App* e = app.add_subcommand("eval", "Perplexity and model-vs-reference accuracy checks");
  e->require_subcommand(1);

  auto p = std::make_shared<EvalArgs>();
  CLI::App* ppl = e->add_subcommand("ppl", "Perplexity over a text file (sliding windows)");
  AddCommon(ppl, p.get());
  ppl->add_flag("--exact", p->exact, "FP32 activations and KV cache (reference mode)");
  ppl->callback([p, exit_code] { *exit_code = RunPpl(*p); });

  auto c = std::make_shared<EvalArgs>();
  CLI::App* cmp = e->add_subcommand(
      "compare", "KL, top-1 agreement, PPL ratio and max relative logit deviation vs a "
                 "reference; exits 1 when the deviation exceeds --max-deviation");
  AddCommon(cmp, c.get());
  cmp->add_option("--reference", c->reference, "Reference model (may equal --model)")
      ->required();
  cmp->add_option("--max-deviation", c->max_deviation,
                  "Largest allowed mean over positions of max_i |d_i - mean d| / (max l_r - "
                  "min l_r), d = l_model - l_ref (largest relative logit error)");
  cmp->add_option("--max-weight-deviation", c->max_weight_deviation,
                  "Largest allowed ||W_m - W_r|| / ||W_r|| of any weight matrix both models "
                  "have (same name and shape)");
  cmp->add_flag("--diagnose", c->diagnose,
                "Always print the per-layer and per-tensor deviation (else only on failure)");
  cmp->add_option("--reference-device", c->reference_device,
                  "Where the reference runs (default: --device's), e.g. cpu to check a GPU's "
                  "logits against the CPU engine's");
  cmp->add_flag("--exact-reference", c->exact_reference,
                "Run the reference with FP32 activations and KV cache");
  cmp->callback([c, exit_code] { *exit_code = RunCompare(*c); });
}

}  // namespace peng::tools
