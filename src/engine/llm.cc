#include "engine/llm.h"

#include <algorithm>
#include <chrono>

namespace peng {
namespace {

double Now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

size_t StopHoldback(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& s : stops) {
    for (size_t n = std::min(s.size() - 1, text.size()); n > hold; --n) {
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  return hold;
}

EngineOptions Llm::CoreOptions(const LlmOptions& o) {
  EngineOptions e;
  e.model_path = o.model_path;
  e.threads = o.threads;
  e.device = o.device;
  e.max_model_len = o.max_model_len;
  e.max_num_seqs = 1;
  e.max_num_batched_tokens = o.max_num_batched_tokens;
  e.block_size = o.block_size;
  e.num_kv_blocks = o.block_size > 0 ? (o.max_model_len + o.block_size - 1) / o.block_size : 0;
  e.enable_prefix_caching = o.enable_prefix_caching;
  e.kv_dtype = o.kv_dtype;
  e.measure_peaks = false;
  e.tensor_parallel_size = o.tensor_parallel_size;
  e.pipeline_parallel_size = o.pipeline_parallel_size;
  e.enable_expert_parallel = o.enable_expert_parallel;
  e.data_parallel_size = o.data_parallel_size;
  e.huge_pages = o.huge_pages;
  return e;
}

StatusOr<std::unique_ptr<Llm>> Llm::Load(const LlmOptions& o) {
  if (o.threads < 0) return InvalidArgument("--threads must be >= 0");
  if (o.block_size <= 0 || o.max_num_batched_tokens <= 0 || o.max_model_len <= 0)
    return InvalidArgument("block size, batch size and context must be positive");
  PENG_ASSIGN_OR_RETURN(std::unique_ptr<EngineCore> core, CreateEngineCore(CoreOptions(o)));
  return std::unique_ptr<Llm>(new Llm(std::move(core)));
}

StatusOr<std::vector<int32_t>> Llm::Encode(const std::string& text) const {
  const Tokenizer* tok = tokenizer();
  if (!tok) return InvalidArgument("this model has no tokenizer; pass token ids instead");
  return tok->Encode(text, tok->add_bos_default());
}

Status Llm::Run(GenerateRequest request,
                const std::function<bool(const RequestOutput&)>& on_event) {
  request.id = "llm-" + std::to_string(next_id_++);
  const std::string id = request.id;
  PENG_RETURN_IF_ERROR(core_->Add(std::move(request)));
  std::string error;
  bool aborted = false, finished = false;
  while (!finished) {
    for (const EngineCoreOutput& o : core_->Step()) {
      if (o.output.finish_reason == "error") error = o.output.error;
      if (!aborted && !on_event(o.output)) {
        core_->Abort(id);
        aborted = true;
      }
      finished = finished || o.request_finished;
    }
  }
  if (!error.empty()) return Internal(error);
  return OkStatus();
}

StatusOr<std::vector<float>> Llm::PromptHiddenStates(std::span<const int32_t> tokens) {
  const int64_t D = model().config().hidden_size, L = model().config().n_layers;
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<float> out((L + 1) * n * D);
  GenerateRequest r;
  r.prompt.assign(tokens.begin(), tokens.end());
  r.params.temperature = 0;
  r.return_hidden_states = true;
  int64_t p = 0;  // prompt tokens received
  bool bad = false;
  PENG_RETURN_IF_ERROR(Run(std::move(r), [&](const RequestOutput& ev) {
    if (ev.hidden_states.empty()) return true;
    const int64_t m = static_cast<int64_t>(ev.hidden_states.size()) / ((L + 1) * D);
    if (m * (L + 1) * D != static_cast<int64_t>(ev.hidden_states.size()) || p + m > n) {
      bad = true;
      return false;
    }
    for (int64_t l = 0; l <= L; ++l)
      std::copy_n(ev.hidden_states.data() + l * m * D, m * D, out.data() + (l * n + p) * D);
    p += m;
    return true;
  }));
  if (bad || p != n) return Internal("the model did not capture its hidden states");
  return out;
}

StatusOr<std::vector<float>> Llm::PromptLogits(std::span<const int32_t> tokens) {
  const int64_t V = model().config().vocab_size;
  std::vector<float> out;
  out.reserve(tokens.size() * V);
  GenerateRequest r;
  r.prompt.assign(tokens.begin(), tokens.end());
  r.params.temperature = 0;
  r.return_prompt_logits = true;
  PENG_RETURN_IF_ERROR(Run(std::move(r), [&](const RequestOutput& ev) {
    out.insert(out.end(), ev.prompt_logits.begin(), ev.prompt_logits.end());
    return true;
  }));
  if (out.size() != tokens.size() * V) return Internal("the engine returned too few logit rows");
  return out;
}

Status Llm::Generate(const std::vector<int32_t>& prompt, const SamplingParams& params,
                     const TokenCallback& on_text, GenerateStats* stats,
                     std::vector<int32_t>* output_ids) {
  PENG_RETURN_IF_ERROR(params.Validate());
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n > 0 && n + params.max_tokens > max_model_len())  // as the server answers
    return OutOfRange("prompt of " + std::to_string(n) + " tokens + max_tokens " +
                      std::to_string(params.max_tokens) + " exceeds the context length " +
                      std::to_string(max_model_len()));
  GenerateRequest r;
  r.prompt = prompt;
  r.params = params;
  GenerateStats st;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  const double t0 = Now();
  double t1 = 0;  // the first token
  int32_t last = -1;
  bool stopped = false;  // by on_text
  PENG_RETURN_IF_ERROR(Run(std::move(r), [&](const RequestOutput& ev) {
    if (!ev.token_ids.empty()) {
      if (st.generated_tokens == 0) t1 = Now();
      st.generated_tokens += static_cast<int64_t>(ev.token_ids.size());
      last = ev.token_ids.back();
      if (output_ids) output_ids->insert(output_ids->end(), ev.token_ids.begin(), ev.token_ids.end());
    }
    if (ev.finish_reason) st.finish_reason = stopped ? "stop" : *ev.finish_reason;
    if (!stopped && !ev.text.empty() && !on_text(last, ev.text)) stopped = true;
    return !stopped;
  }));
  const double t2 = Now();
  if (stopped) st.finish_reason = "stop";
  if (st.generated_tokens == 0) t1 = t2;
  st.prompt_seconds = t1 - t0;
  st.generate_seconds = t2 - t1;
  if (stats) *stats = st;
  return OkStatus();
}

StatusOr<double> Llm::BenchPrefill(std::span<const int32_t> tokens, int64_t* computed) {
  GenerateRequest r;
  r.prompt.assign(tokens.begin(), tokens.end());
  r.params.temperature = 0;
  r.params.max_tokens = 1;
  r.params.ignore_eos = true;
  EngineStats before;
  core_->FillStats(&before);
  const double t0 = Now();
  PENG_RETURN_IF_ERROR(Run(std::move(r), [](const RequestOutput&) { return true; }));
  const double s = Now() - t0;
  if (computed) {
    EngineStats after;
    core_->FillStats(&after);
    *computed = static_cast<int64_t>(tokens.size()) -
                (after.prefix_cache_hits - before.prefix_cache_hits);
  }
  return s;
}

StatusOr<double> Llm::BenchDecode(int64_t n_tokens, std::span<const int32_t> context) {
  GenerateRequest r;
  if (context.empty())
    r.prompt = {std::max(0, model().config().bos_id)};
  else
    r.prompt.assign(context.begin(), context.end());
  r.params.temperature = 0;
  r.params.max_tokens = static_cast<int>(n_tokens + 1);
  r.params.ignore_eos = true;
  double t0 = 0;  // the first token (from the prompt's step): the clock covers n decode steps
  PENG_RETURN_IF_ERROR(Run(std::move(r), [&](const RequestOutput& ev) {
    if (t0 == 0 && !ev.token_ids.empty()) t0 = Now();
    return true;
  }));
  return Now() - t0;
}

}  // namespace peng
