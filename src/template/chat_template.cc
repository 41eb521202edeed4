#include "template/chat_template.h"

#include "template/parser.h"

namespace peng {

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
  return RenderValue(tmpl::Value::FromJson(context));
}

StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context) const {
  return RenderValue(tmpl::Value::FromJson(context));
}

StatusOr<std::string> ApplyChatTemplate(const std::string& source, const nlohmann::json& messages,
                                        bool add_generation_prompt, const std::string& bos_token,
                                        const std::string& eos_token, const nlohmann::json& extra) {
  PENG_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Parse(source));
  nlohmann::json context = nlohmann::json::object();
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

}  // namespace peng
