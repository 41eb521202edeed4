// libFuzzer target: the whole request path of the OpenAI server, without sockets, on the tiny
// DeepSeek model folder tests/data/deepseek_tiny/serve (its tokenizer.json and chat template).
//
// Input: byte 0 picks the endpoint (bit 0: chat, else completions); bytes 1..8 seed a
// deterministic stream that fills the logit rows and picks each row's kind (ordinary, ties,
// huge, mostly masked, +inf, NaN, all masked, all NaN); the rest is the JSON body. The body goes through ParseJsonBody -> ParseRequest -> PreparePrompts
// exactly as Server::Prepare runs them. An error must be a well-formed ApiError whose JSON
// dumps; a request that passes must have valid SamplingParams and in-vocabulary prompts, and
// then every prompt (and up to two of its n completions) samples a few tokens with a real
// Sampler over a vocab-sized logit row, with TopLogprobs/LogProb when logprobs were asked for,
// detokenizes them with a StreamingDecoder, and the response objects the server would send
// (final response, stream chunks, usage chunk, logprobs) must dump to valid JSON.
//
// PENG_FUZZ_SAMPLER=off skips the sampling stage and PENG_FUZZ_SAMPLER=finite keeps the logit
// rows finite, for local runs while a sampler finding is being fixed; the default runs it all.
// PENG_FUZZ_VERBOSE=1 prints each request's outcome, sampling parameters and logit rows (to
// describe a reproducer).
// The fixture folder is $PENG_SOURCE_DIR/tests/data/deepseek_tiny/serve (PENG_SOURCE_DIR is
// also compiled in).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/test_paths.h"
#include "engine/sampler.h"
#include "grammar/grammar.h"
#include "server/grammar_cache.h"
#include "engine/sampling_params.h"
#include "server/protocol.h"
#include "server/responses.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace {

using peng::server::ApiError;
using peng::server::Endpoint;
using peng::server::MaybeError;
using peng::server::ParsedRequest;
using peng::server::PromptLimits;

enum class SamplerMode { kFull, kFinite, kOff };

struct Fixture {
  std::unique_ptr<peng::Tokenizer> tokenizer;
  std::unique_ptr<peng::server::GrammarCache> grammars;  // as the server compiles them
  PromptLimits limits;
  SamplerMode sampler = SamplerMode::kFull;
  bool verbose = false;
};

constexpr const char* kKindNames[] = {"ordinary",   "ties",      "huge", "mostly -inf",
                                      "+inf",       "one NaN",   "all -inf", "all NaN"};

const Fixture& GetFixture() {
  static const Fixture* fixture = [] {
    auto* f = new Fixture();
    const std::string dir = peng::test_util::SourceDir() + "/tests/data/deepseek_tiny/serve";
    auto tok = peng::Tokenizer::ForModel(dir);
    if (!tok.ok() || *tok == nullptr || (*tok)->chat_template().empty()) {
      std::fprintf(stderr, "request_fuzz: no tokenizer with a chat template in %s: %s\n",
                   dir.c_str(), tok.ok() ? "missing" : tok.status().ToString().c_str());
      std::abort();
    }
    f->tokenizer = std::move(tok).value();
    f->grammars = std::make_unique<peng::server::GrammarCache>(f->tokenizer.get());
    std::ifstream in(dir + "/config.json");
    const nlohmann::json config = nlohmann::json::parse(in, nullptr, false);
    PENG_CHECK(config.is_object() && config.contains("vocab_size"));
    // The engine's limits: the model's vocabulary (640, larger than the tokenizer's 602, as
    // real checkpoints pad it) and a short context so that length errors are reachable.
    f->limits.vocab_size = config["vocab_size"].get<int64_t>();
    f->limits.max_model_len = 512;
    PENG_CHECK(f->limits.vocab_size >= f->tokenizer->vocab_size());
    f->verbose = std::getenv("PENG_FUZZ_VERBOSE") != nullptr;
    if (const char* m = std::getenv("PENG_FUZZ_SAMPLER")) {
      if (std::strcmp(m, "off") == 0) f->sampler = SamplerMode::kOff;
      if (std::strcmp(m, "finite") == 0) f->sampler = SamplerMode::kFinite;
    }
    return f;
  }();
  return *fixture;
}

// What Server::ErrorResponse does with an error: it must serialize.
void CheckError(const ApiError& e, const Fixture& fx) {
  if (fx.verbose) std::fprintf(stderr, "request_fuzz: %d %s\n", e.http_status, e.message.c_str());
  PENG_CHECK(e.http_status >= 400 && e.http_status < 600);
  PENG_CHECK(!e.message.empty());
  const std::string body =
      e.ToJson().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  PENG_CHECK(body.rfind("{\"error\":", 0) == 0);
}

// splitmix64: a deterministic stream from the input's seed bytes.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float Uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(Next() >> 40) * 0x1.0p-24f;
  }
};

// One row of logits. Kinds 0-3 are what a sane model produces; 4-7 are the odd rows a broken
// checkpoint or an overflow can produce.
void FillLogits(Rng* rng, int kind, bool finite_only, std::vector<float>* row) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr float kMax = std::numeric_limits<float>::max();
  if (finite_only) kind &= 3;
  for (float& l : *row) l = rng->Uniform(-20.0f, 20.0f);
  const size_t n = row->size();
  auto pick = [&] { return static_cast<size_t>(rng->Next() % n); };
  switch (kind) {
    case 0: break;
    case 1:  // ties everywhere
      for (float& l : *row) l = std::round(l / 10.0f);
      break;
    case 2:  // one peak, huge values of both signs
      (*row)[pick()] = kMax;
      (*row)[pick()] = -kMax;
      (*row)[pick()] = 1e30f;
      break;
    case 3:  // most of the vocabulary masked out
      for (float& l : *row) {
        if (rng->Next() % 8 != 0) l = -kInf;
      }
      break;
    case 4:  // +inf logits
      (*row)[pick()] = kInf;
      if (rng->Next() % 2) (*row)[pick()] = kInf;
      break;
    case 5:  // a NaN among ordinary values
      (*row)[pick()] = std::numeric_limits<float>::quiet_NaN();
      break;
    case 6:  // everything masked
      std::fill(row->begin(), row->end(), -kInf);
      break;
    case 7:  // all NaN
      std::fill(row->begin(), row->end(), std::numeric_limits<float>::quiet_NaN());
      break;
  }
}

// A response body must be JSON that parses back (DumpJson replaces invalid UTF-8).
void CheckJson(const std::string& text) {
  PENG_CHECK(!nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false).is_discarded());
}

// The response objects for one sampled completion, as Generation builds them.
void CheckResponses(const ParsedRequest& req, const std::vector<peng::TokenLogprob>& lps,
                    size_t prompt_tokens, int completion, const Fixture& fx) {
  peng::server::ResponseMeta meta;
  meta.endpoint = req.endpoint;
  meta.id = req.endpoint == Endpoint::kChat ? "chatcmpl-fuzz" : "cmpl-fuzz";
  meta.created = 1;
  meta.model = "deepseek_tiny";
  const bool chat = req.endpoint == Endpoint::kChat;
  peng::server::Usage usage{static_cast<int64_t>(prompt_tokens), static_cast<int64_t>(lps.size())};
  peng::server::ChoiceResult choice;
  choice.index = completion;
  for (const peng::TokenLogprob& lp : lps) choice.text += lp.text;
  if (req.logprobs) choice.logprobs = lps;
  choice.finish_reason = "length";
  CheckJson(peng::server::DumpJson(
      peng::server::FinalResponse(meta, {choice}, usage, req.logprobs, fx.tokenizer.get())));
  int64_t text_offset = 0;
  for (size_t i = 0; i < lps.size(); ++i) {
    peng::server::ChunkChoice c;
    c.index = completion;
    c.text = lps[i].text;
    c.role = chat && i == 0;
    if (req.logprobs) {
      c.logprobs = chat ? peng::server::ChatLogprobs({lps[i]}, fx.tokenizer.get())
                        : peng::server::CompletionLogprobs({lps[i]}, fx.tokenizer.get(), &text_offset);
    }
    if (i + 1 == lps.size()) c.finish_reason = "length";
    const std::string sse = peng::server::SseData(
        peng::server::StreamChunk(meta, c, req.include_usage, req.continuous_usage ? std::optional(usage) : std::nullopt));
    PENG_CHECK(sse.rfind("data: ", 0) == 0 && sse.size() >= 8 && sse.substr(sse.size() - 2) == "\n\n");
    CheckJson(sse.substr(6, sse.size() - 8));
  }
  if (req.include_usage) CheckJson(peng::server::DumpJson(peng::server::UsageChunk(meta, usage)));
}

void SamplePrompt(const ParsedRequest& req, const std::vector<int32_t>& prompt, int completion,
                  Rng* rng, const Fixture& fx) {
  const int64_t vocab = fx.limits.vocab_size;
  peng::SamplingParams params = req.params;
  // Completion i of a seeded request samples with seed + i (Engine); an unseeded one would
  // draw from std::random_device, which a fuzzer cannot replay: seed it from the input.
  if (params.seed >= 0) {
    params.seed += completion;
  } else {
    params.seed = static_cast<int64_t>(rng->Next() >> 1);
  }
  PENG_CHECK(params.Validate().ok());
  if (fx.verbose) {
    std::fprintf(stderr,
                 "request_fuzz: sampling completion %d of a %zu-token prompt: temperature=%g top_k=%d "
                 "top_p=%g min_p=%g repetition_penalty=%g presence_penalty=%g frequency_penalty=%g "
                 "seed=%lld max_tokens=%d logprobs=%d top_logprobs=%d\n",
                 completion, prompt.size(), params.temperature, params.top_k, params.top_p, params.min_p,
                 params.repetition_penalty, params.presence_penalty, params.frequency_penalty,
                 static_cast<long long>(params.seed), params.max_tokens, req.logprobs ? 1 : 0,
                 req.top_logprobs);
  }
  peng::Sampler sampler(params);
  peng::TokenHistory history(prompt);
  peng::StreamingDecoder decoder(*fx.tokenizer, /*skip_special=*/true);
  std::vector<float> row(static_cast<size_t>(vocab)), raw;
  std::vector<std::pair<int32_t, float>> top;
  std::vector<peng::TokenLogprob> lps;
  const int steps = std::min(params.max_tokens, 3);
  for (int step = 0; step < steps; ++step) {
    const int kind = static_cast<int>(rng->Next() % 8);
    FillLogits(rng, kind, fx.sampler == SamplerMode::kFinite, &row);
    if (fx.verbose) {
      std::fprintf(stderr, "request_fuzz: step %d: %s logits (vocab %lld)\n", step,
                   kKindNames[fx.sampler == SamplerMode::kFinite ? kind & 3 : kind],
                   static_cast<long long>(vocab));
    }
    float logprob = 0.0f;
    if (req.logprobs) {
      raw = row;
      if (req.top_logprobs > 0) {
        peng::Sampler::TopLogprobs(raw.data(), vocab, req.top_logprobs, &top);
        PENG_CHECK(top.size() == static_cast<size_t>(std::min<int64_t>(req.top_logprobs, vocab)));
        for (const auto& [id, lp] : top) PENG_CHECK(id >= 0 && id < vocab);
      }
    }
    const int32_t id = sampler.Sample(row.data(), vocab, history,
                                      req.logprobs ? &logprob : nullptr);
    PENG_CHECK(id >= 0 && id < vocab);
    if (req.logprobs) (void)peng::Sampler::LogProb(raw.data(), vocab, id);
    history.Append(id);
    peng::TokenLogprob lp;
    lp.id = id;
    lp.logprob = logprob;
    if (req.top_logprobs > 0) lp.top = top;
    lp.text = decoder.Push(id);
    lps.push_back(std::move(lp));
  }
  if (!lps.empty()) lps.back().text += decoder.Flush();
  CheckResponses(req, lps, prompt.size(), completion, fx);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 9) return 0;
  const Fixture& fx = GetFixture();
  const Endpoint endpoint = (data[0] & 1) ? Endpoint::kChat : Endpoint::kCompletions;
  uint64_t seed = 0;
  std::memcpy(&seed, data + 1, sizeof(seed));
  const std::string_view body(reinterpret_cast<const char*>(data + 9), size - 9);

  nlohmann::ordered_json json;
  if (MaybeError e = peng::server::ParseJsonBody(body, &json)) {
    CheckError(*e, fx);
    return 0;
  }
  ParsedRequest req;
  if (MaybeError e = peng::server::ParseRequest(json, endpoint, &req)) {
    CheckError(*e, fx);
    return 0;
  }
  PENG_CHECK(req.endpoint == endpoint);
  PENG_CHECK(req.n >= 1);
  if (MaybeError e = peng::server::PreparePrompts(&req, fx.tokenizer.get(), fx.limits)) {
    CheckError(*e, fx);
    return 0;
  }

  // What the engine relies on once a request is accepted.
  PENG_CHECK(req.params.Validate().ok());
  PENG_CHECK(!req.prompts.empty());
  for (const std::vector<int32_t>& p : req.prompts) {
    PENG_CHECK(!p.empty());
    PENG_CHECK(static_cast<int64_t>(p.size()) + req.params.max_tokens <= fx.limits.max_model_len);
    for (int32_t id : p) PENG_CHECK(id >= 0 && id < fx.limits.vocab_size);
  }
  if (req.prompt_is_text) PENG_CHECK(req.prompts.size() == req.prompt_texts.size());

  if (fx.verbose) {
    std::fprintf(stderr, "request_fuzz: accepted: %zu prompt(s), n=%d\n", req.prompts.size(), req.n);
  }
  // An output constraint: compiled as the server does (a bad grammar is a 400 with a message);
  // then a few steps of the matcher, each over a fresh mask, taking the lowest allowed token.
  if (!req.grammar.empty()) {
    auto g = fx.grammars->Get(req.grammar);
    if (!g.ok()) {
      PENG_CHECK(!g.status().message().empty());
      return 0;
    }
    peng::grammar::Matcher m(*g);
    std::vector<uint32_t> mask(peng::grammar::MaskWords(fx.limits.vocab_size));
    for (int step = 0; step < 8 && !m.IsTerminated(); ++step) {
      m.FillMask(mask.data(), fx.limits.vocab_size);
      int32_t pick = -1;
      for (int32_t id = 0; id < fx.limits.vocab_size && pick < 0; ++id)
        if (mask[id / 32] >> (id % 32) & 1) pick = id;
      if (pick < 0) break;  // a dead end (the engine fails such a request)
      PENG_CHECK(m.Accept(pick));
    }
  }
  if (fx.sampler == SamplerMode::kOff) return 0;
  Rng rng{seed};
  const size_t prompts = std::min<size_t>(req.prompts.size(), 4);
  for (size_t i = 0; i < prompts; ++i) {
    for (int c = 0; c < std::min(req.n, 2); ++c) SamplePrompt(req, req.prompts[i], c, &rng, fx);
  }
  return 0;
}
