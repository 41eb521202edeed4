// libFuzzer target: chat templates (src/template) on arbitrary template sources and contexts.
//
// Input: the template source, then optionally a NUL byte and a JSON context: an array is the
// messages; an object gives "messages" and any other variables (tools, add_generation_prompt,
// bos_token, eos_token, chat_template_kwargs-style extras), in the shape of
// tests/data/chat_templates/conversations.json. Without a usable context a fixed conversation
// (system, user, assistant, user with unicode) is rendered. ApplyChatTemplate must return a
// string or a Status: never crash, throw, hang, run out of memory or overflow the stack. It
// renders with the server's nesting limits (what bounds the stack) but an eighth of its steps,
// loop iterations and work budget and a smaller output cap, so that a runaway template stops
// in a few seconds under ASan instead of tens (the unit tests cover the defaults).
// PENG_FUZZ_VERBOSE=1 prints each result's status.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "template/chat_template.h"

namespace {

const nlohmann::json& DefaultMessages() {
  static const nlohmann::json* m = new nlohmann::json(nlohmann::json::parse(R"([
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello! 你好 🙂"},
    {"role": "assistant", "content": "Hi.\nHow can I help?"},
    {"role": "user", "content": "  Tell me about \"quotes\" & <tags>  "}
  ])"));
  return *m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string source(input.substr(0, nul));

  nlohmann::json messages = DefaultMessages();
  nlohmann::json extra = nlohmann::json::object();
  bool add_generation_prompt = (size % 2) == 1;
  std::string bos = "<s>", eos = "</s>";
  if (nul != std::string_view::npos) {
    nlohmann::json ctx = nlohmann::json::parse(input.substr(nul + 1), nullptr,
                                               /*allow_exceptions=*/false);
    if (ctx.is_array()) {
      messages = std::move(ctx);
    } else if (ctx.is_object()) {
      for (auto it = ctx.begin(); it != ctx.end(); ++it) {
        if (it.key() == "messages") {
          messages = *it;
        } else if (it.key() == "add_generation_prompt" && it->is_boolean()) {
          add_generation_prompt = it->get<bool>();
        } else if (it.key() == "bos_token" && it->is_string()) {
          bos = it->get<std::string>();
        } else if (it.key() == "eos_token" && it->is_string()) {
          eos = it->get<std::string>();
        } else {
          extra[it.key()] = *it;
        }
      }
    }
  }

  peng::tmpl::RenderLimits limits;
  limits.max_steps /= 8;
  limits.max_loop_iterations /= 8;
  limits.max_work_bytes /= 8;
  limits.max_output_bytes = 8u << 20;
  peng::StatusOr<std::string> out =
      peng::ApplyChatTemplate(source, messages, add_generation_prompt, bos, eos, extra, limits);
  static const bool verbose = std::getenv("PENG_FUZZ_VERBOSE") != nullptr;
  if (verbose) {
    std::fprintf(stderr, "jinja_fuzz: %s\n",
                 out.ok() ? ("ok, " + std::to_string(out->size()) + " bytes").c_str()
                          : out.status().ToString().c_str());
  }
  if (!out.ok()) {
    PENG_CHECK(!out.status().message().empty());
  } else {
    PENG_CHECK(out->size() <= limits.max_output_bytes);
  }
  return 0;
}
