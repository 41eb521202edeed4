#include "engine/llm.h"

#include <algorithm>
#include <chrono>

#include "engine/sampler.h"
#include "formats/gguf.h"
#include "model/registry.h"

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

StatusOr<std::unique_ptr<Llm>> Llm::Load(const LlmOptions& o) {
  if (o.threads < 0) return InvalidArgument("--threads must be >= 0");
  if (o.block_size <= 0 || o.prefill_chunk <= 0 || o.max_context <= 0)
    return InvalidArgument("block size, prefill chunk and context must be positive");
  std::unique_ptr<Llm> llm(new Llm(o.threads));
  PENG_ASSIGN_OR_RETURN(llm->model_, LoadModel(o.model_path));
  PENG_ASSIGN_OR_RETURN(llm->tokenizer_, Tokenizer::ForModel(o.model_path));
  const ModelConfig& cfg = llm->model_->config();
  llm->max_context_ = std::min<int64_t>(o.max_context, cfg.max_position > 0 ? cfg.max_position
                                                                            : o.max_context);
  llm->prefill_chunk_ = o.prefill_chunk;
  const int64_t n_blocks = (llm->max_context_ + o.block_size - 1) / o.block_size;
  PENG_ASSIGN_OR_RETURN(llm->kv_,
                        KvCache::Create(llm->model_->kv_spec(), n_blocks, o.block_size, o.kv_dtype));
  llm->blocks_ = std::make_unique<BlockPool>(n_blocks);
  return llm;
}

StatusOr<std::vector<int32_t>> Llm::Encode(const std::string& text) const {
  if (!tokenizer_) return InvalidArgument("this model has no tokenizer; pass token ids instead");
  return tokenizer_->Encode(text, tokenizer_->add_bos_default());
}

bool Llm::IsEndOfGeneration(int32_t id) const {
  return tokenizer_ ? tokenizer_->IsEndOfGeneration(id) : id == model_->config().eos_id;
}

Status Llm::Reset() {
  table_.Clear(blocks_.get());
  return OkStatus();
}

Status Llm::Step(std::span<const int32_t> tokens, int64_t pos0, bool all_logits, float* logits,
                 std::vector<float>* capture_hidden) {
  const int64_t end = pos0 + static_cast<int64_t>(tokens.size());
  if (end > max_context_)
    return OutOfRange("sequence of " + std::to_string(end) + " tokens exceeds the context length " +
                      std::to_string(max_context_));
  if (!table_.EnsureCapacity(blocks_.get(), kv_->block_size(), end))
    return ResourceExhausted("KV cache is full");
  ForwardBatch batch;
  batch.tokens.assign(tokens.begin(), tokens.end());
  SeqBatchEntry e;
  e.n_tokens = static_cast<int64_t>(tokens.size());
  e.pos0 = pos0;
  e.block_table = table_.blocks().data();
  e.n_blocks = static_cast<int64_t>(table_.blocks().size());
  e.all_logits = all_logits;
  e.want_logits = logits != nullptr;
  batch.seqs.push_back(e);
  batch.capture_hidden = capture_hidden;
  return model_->Forward(batch, kv_.get(), logits, &pool_);
}

StatusOr<std::vector<float>> Llm::PromptHiddenStates(std::span<const int32_t> tokens) {
  PENG_RETURN_IF_ERROR(Reset());
  const int64_t D = model_->config().hidden_size, L = model_->config().n_layers;
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<float> out((L + 1) * n * D), chunk;
  for (int64_t p = 0; p < n; p += prefill_chunk_) {
    const int64_t m = std::min<int64_t>(prefill_chunk_, n - p);
    PENG_RETURN_IF_ERROR(Step(tokens.subspan(p, m), p, false, nullptr, &chunk));
    if (static_cast<int64_t>(chunk.size()) != (L + 1) * m * D)
      return Internal("the model did not capture its hidden states");
    for (int64_t l = 0; l <= L; ++l)
      std::copy_n(chunk.data() + l * m * D, m * D, out.data() + (l * n + p) * D);
  }
  PENG_RETURN_IF_ERROR(Reset());
  return out;
}

StatusOr<std::vector<float>> Llm::PromptLogits(std::span<const int32_t> tokens) {
  PENG_RETURN_IF_ERROR(Reset());
  const int64_t V = model_->config().vocab_size;
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<float> out(n * V);
  for (int64_t p = 0; p < n; p += prefill_chunk_) {
    const int64_t m = std::min<int64_t>(prefill_chunk_, n - p);
    PENG_RETURN_IF_ERROR(Step(tokens.subspan(p, m), p, true, out.data() + p * V));
  }
  PENG_RETURN_IF_ERROR(Reset());
  return out;
}

Status Llm::Generate(const std::vector<int32_t>& prompt, const SamplingParams& params,
                     const TokenCallback& on_text, GenerateStats* stats,
                     std::vector<int32_t>* output_ids) {
  PENG_RETURN_IF_ERROR(params.Validate());
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n == 0) return InvalidArgument("the prompt is empty");
  if (n + params.max_tokens > max_context_)
    return OutOfRange("prompt of " + std::to_string(n) + " tokens + max_tokens " +
                      std::to_string(params.max_tokens) + " exceeds the context length " +
                      std::to_string(max_context_));
  PENG_RETURN_IF_ERROR(Reset());
  const int64_t V = model_->config().vocab_size;
  logits_.resize(V);
  GenerateStats st;
  st.prompt_tokens = n;
  const double t0 = Now();
  for (int64_t p = 0; p < n; p += prefill_chunk_) {
    const int64_t m = std::min<int64_t>(prefill_chunk_, n - p);
    const bool last = p + m == n;
    PENG_RETURN_IF_ERROR(Step(std::span(prompt).subspan(p, m), p, false,
                              last ? logits_.data() : nullptr));
  }
  const double t1 = Now();
  st.prompt_seconds = t1 - t0;

  Sampler sampler(params);
  TokenHistory history(prompt);
  std::unique_ptr<StreamingDecoder> decoder;
  if (tokenizer_) decoder = std::make_unique<StreamingDecoder>(*tokenizer_);
  std::string pending;  // decoded text held back while a stop string may be forming
  st.finish_reason = "length";
  int64_t pos = n;
  for (int i = 0; i < params.max_tokens; ++i) {
    const int32_t id = sampler.Sample(logits_.data(), V, history);
    history.Append(id);
    if (output_ids) output_ids->push_back(id);
    ++st.generated_tokens;
    const bool is_stop_id =
        std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), id) !=
        params.stop_token_ids.end();
    if ((!params.ignore_eos && IsEndOfGeneration(id)) || is_stop_id) {
      st.finish_reason = "stop";
      break;
    }
    if (decoder) pending += decoder->Push(id);
    bool stopped = false;
    for (const std::string& s : params.stop) {
      const size_t at = pending.find(s);
      if (at != std::string::npos) {
        pending.resize(params.include_stop_str_in_output ? at + s.size() : at);
        stopped = true;
      }
    }
    const size_t hold = stopped ? 0 : StopHoldback(pending, params.stop);
    if (pending.size() > hold) {
      if (!on_text(id, pending.substr(0, pending.size() - hold))) {
        stopped = true;
      }
      pending.erase(0, pending.size() - hold);
    }
    if (stopped) {
      st.finish_reason = "stop";
      break;
    }
    if (i + 1 == params.max_tokens) break;
    const int32_t next[1] = {id};
    PENG_RETURN_IF_ERROR(Step(next, pos++, false, logits_.data()));
  }
  if (st.finish_reason == "length") {
    if (decoder) pending += decoder->Flush();
    if (!pending.empty()) on_text(-1, pending);
  }
  st.generate_seconds = Now() - t1;
  PENG_RETURN_IF_ERROR(Reset());
  if (stats) *stats = st;
  return OkStatus();
}

StatusOr<double> Llm::BenchPrefill(std::span<const int32_t> tokens) {
  PENG_RETURN_IF_ERROR(Reset());
  logits_.resize(model_->config().vocab_size);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const double t0 = Now();
  for (int64_t p = 0; p < n; p += prefill_chunk_) {
    const int64_t m = std::min<int64_t>(prefill_chunk_, n - p);
    PENG_RETURN_IF_ERROR(Step(tokens.subspan(p, m), p, false,
                              p + m == n ? logits_.data() : nullptr));
  }
  return Now() - t0;
}

StatusOr<double> Llm::BenchDecode(int64_t n_tokens) {
  PENG_RETURN_IF_ERROR(Reset());
  logits_.resize(model_->config().vocab_size);
  const int32_t bos[1] = {std::max(0, model_->config().bos_id)};
  PENG_RETURN_IF_ERROR(Step(bos, 0, false, logits_.data()));
  const double t0 = Now();
  for (int64_t i = 0; i < n_tokens; ++i) {
    int32_t id = static_cast<int32_t>(
        std::max_element(logits_.begin(), logits_.end()) - logits_.begin());
    const int32_t tok[1] = {id};
    PENG_RETURN_IF_ERROR(Step(tok, 1 + i, false, logits_.data()));
  }
  return Now() - t0;
}

}  // namespace peng
