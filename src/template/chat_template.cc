#include "template/chat_template.h"

#include "template/parser.h"

namespace peng {
namespace {

// Whether `j` nests arrays/objects deeper than `limit`; recurses at most limit + 1 levels, so
// it is safe on any input (converting or copying a deeper one would recurse without bound).
template <typename Json>
bool DeeperThan(const Json& j, int limit) {
  if (!j.is_structured()) return false;
  if (limit <= 0) return true;
  for (const auto& e : j) {
    if (DeeperThan(e, limit - 1)) return true;
  }
  return false;
}

Status TooDeep(const char* what, int limit) {
  return ResourceExhausted(std::string("chat template ") + what + " nested deeper than " +
                           std::to_string(limit) + " levels of lists and dicts");
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::Parse(const std::string& source) {
  PENG_ASSIGN_OR_RETURN(tmpl::NodeList nodes, tmpl::ParseTemplate(source));
  ChatTemplate t;
  t.nodes_ = std::make_shared<const tmpl::NodeList>(std::move(nodes));
  return t;
}

StatusOr<std::string> ChatTemplate::RenderValue(const tmpl::Value& context) const {
  if (!context.is_dict()) return InvalidArgument("chat template context must be a JSON object");
  return tmpl::RenderTemplate(*nodes_, context, limits_);
}

StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& context) const {
  if (DeeperThan(context, limits_.max_value_depth)) return TooDeep("context", limits_.max_value_depth);
  return RenderValue(tmpl::Value::FromJson(context));
}

StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context) const {
  if (DeeperThan(context, limits_.max_value_depth)) return TooDeep("context", limits_.max_value_depth);
  return RenderValue(tmpl::Value::FromJson(context));
}

namespace {

template <typename Json>
StatusOr<std::string> Apply(const std::string& source, const Json& messages,
                            bool add_generation_prompt, const std::string& bos_token,
                            const std::string& eos_token, const Json& extra,
                            const tmpl::RenderLimits& limits) {
  PENG_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Parse(source));
  t.set_limits(limits);
  // Checked before the copies below, which recurse as deep as the values go.
  const int depth_limit = limits.max_value_depth - 1;
  if (DeeperThan(messages, depth_limit)) return TooDeep("messages", depth_limit);
  if (DeeperThan(extra, depth_limit)) return TooDeep("variables", depth_limit);
  Json context = Json::object();
  context["messages"] = messages;
  context["tools"] = nullptr;  // transformers always passes tools and documents, None when absent
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  context["bos_token"] = bos_token;
  context["eos_token"] = eos_token;
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) context[it.key()] = *it;
  } else if (!extra.is_null()) {
    return InvalidArgument("ApplyChatTemplate: extra must be a JSON object");
  }
  return t.Render(context);
}

}  // namespace

StatusOr<std::string> ApplyChatTemplate(const std::string& source, const nlohmann::json& messages,
                                        bool add_generation_prompt, const std::string& bos_token,
                                        const std::string& eos_token, const nlohmann::json& extra,
                                        const tmpl::RenderLimits& limits) {
  return Apply(source, messages, add_generation_prompt, bos_token, eos_token, extra, limits);
}

StatusOr<std::string> ApplyChatTemplateOrdered(const std::string& source,
                                               const nlohmann::ordered_json& messages,
                                               bool add_generation_prompt,
                                               const std::string& bos_token,
                                               const std::string& eos_token,
                                               const nlohmann::ordered_json& extra,
                                               const tmpl::RenderLimits& limits) {
  return Apply(source, messages, add_generation_prompt, bos_token, eos_token, extra, limits);
}

}  // namespace peng
