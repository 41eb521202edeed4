// SamplingParams: the per-request knobs that decide how the next token is chosen from the
// logits and when generation stops. Field meanings and valid ranges follow vLLM / the OpenAI
// API, so the server can map a request body onto this struct field by field; Validate()
// rejects out-of-range values with an InvalidArgument Status that names the field. A plain
// value type: copy it freely; no shared state.
//
// Order of application (see Sampler): repetition penalty, then presence/frequency penalties,
// then greedy if temperature == 0, else temperature -> top-k -> softmax -> top-p -> min-p ->
// draw.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace peng {

struct SamplingParams {
  // Logits are divided by this. 0 selects greedy decoding (argmax, ties -> lowest id); so does
  // any temperature below kMinTemperature (1/temperature would overflow the scaled logits).
  float temperature = 1.0f;
  static constexpr float kMinTemperature = 1e-5f;
  // Keep only the k most likely tokens. 0 or -1 disables.
  int top_k = 0;
  // Keep the smallest set of most likely tokens whose probability sums to >= top_p.
  float top_p = 1.0f;
  // Drop tokens whose probability is below min_p * (probability of the most likely token).
  float min_p = 0.0f;
  // llama.cpp / HF style, over every token seen in prompt + output:
  // logit > 0 ? logit / repetition_penalty : logit * repetition_penalty. 1 disables.
  float repetition_penalty = 1.0f;
  // OpenAI style, over generated tokens only, with count = occurrences in the output:
  // logit -= presence_penalty * (count > 0) + frequency_penalty * count.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Seed of the request's random stream; -1 draws one from std::random_device.
  int64_t seed = -1;
  // Generation budget, in generated tokens.
  int max_tokens = 16;
  // EOS and stop_token_ids are not honoured before this many tokens were generated.
  int min_tokens = 0;
  // Generation stops when the detokenized output contains one of these strings.
  std::vector<std::string> stop = {};
  // Generation stops when one of these ids is sampled (in addition to EOS).
  std::vector<int32_t> stop_token_ids = {};
  // Keep generating past EOS (benchmarks).
  bool ignore_eos = false;
  // Whether a matched stop string stays in the returned text.
  bool include_stop_str_in_output = false;
  // Number of most likely tokens (with log-probabilities) to return per step; 0 = none.
  int logprobs = 0;            // top-N alternatives per token (0..20)
  bool want_logprobs = false;  // return the chosen tokens' logprobs (and the top-N)

  bool greedy() const { return temperature < kMinTemperature; }

  Status Validate() const {
    // Written as !(in range) so that NaN is rejected too.
    if (!(temperature >= 0.0f && temperature <= 100.0f)) {
      return Bad("temperature", std::to_string(temperature), "must be in [0, 100]");
    }
    if (top_k < -1) return Bad("top_k", std::to_string(top_k), "must be >= -1 (0 or -1 = off)");
    if (!(top_p > 0.0f && top_p <= 1.0f)) {
      return Bad("top_p", std::to_string(top_p), "must be in (0, 1]");
    }
    if (!(min_p >= 0.0f && min_p <= 1.0f)) {
      return Bad("min_p", std::to_string(min_p), "must be in [0, 1]");
    }
    if (!(repetition_penalty >= 0.01f && repetition_penalty <= 100.0f)) {
      return Bad("repetition_penalty", std::to_string(repetition_penalty),
                 "must be in [0.01, 100]");
    }
    if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
      return Bad("presence_penalty", std::to_string(presence_penalty), "must be in [-2, 2]");
    }
    if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
      return Bad("frequency_penalty", std::to_string(frequency_penalty), "must be in [-2, 2]");
    }
    if (seed < -1) return Bad("seed", std::to_string(seed), "must be >= -1 (-1 = random)");
    if (top_k > 0x7fffffff - 1) return Bad("top_k", std::to_string(top_k), "is too large");
    if (max_tokens < 1) return Bad("max_tokens", std::to_string(max_tokens), "must be >= 1");
    if (min_tokens < 0 || min_tokens > max_tokens) {
      return Bad("min_tokens", std::to_string(min_tokens), "must be in [0, max_tokens]");
    }
    for (const std::string& s : stop) {
      if (s.empty()) return Bad("stop", "\"\"", "stop strings must not be empty");
    }
    for (int32_t id : stop_token_ids) {
      if (id < 0) return Bad("stop_token_ids", std::to_string(id), "token ids must be >= 0");
    }
    if (logprobs < 0 || logprobs > 20) {
      return Bad("logprobs", std::to_string(logprobs), "must be in [0, 20]");
    }
    return OkStatus();
  }

 private:
  // "top_p = 1.500000: must be in (0, 1]"
  static Status Bad(const char* field, const std::string& value, const char* rule) {
    return InvalidArgument(std::string(field) + " = " + value + ": " + rule);
  }
};

}  // namespace peng
