#include "benchclient/openai_client.h"

#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "benchclient/sse.h"

namespace peng::benchclient {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Text carried by one streamed chunk: completions put it in choices[].text, chat in
// choices[].delta.content (or delta.reasoning_content for reasoning models).
std::string ChunkText(const Json& chunk, bool chat) {
  std::string out;
  const auto it = chunk.find("choices");
  if (it == chunk.end() || !it->is_array()) return out;
  for (const Json& c : *it) {
    if (!chat) {
      if (c.contains("text") && c["text"].is_string()) out += c["text"].get<std::string>();
      continue;
    }
    if (!c.contains("delta") || !c["delta"].is_object()) continue;
    for (const char* key : {"content", "reasoning_content"}) {
      const auto f = c["delta"].find(key);
      if (f != c["delta"].end() && f->is_string()) out += f->get<std::string>();
    }
  }
  return out;
}

std::string FinishReason(const Json& chunk) {
  const auto it = chunk.find("choices");
  if (it == chunk.end() || !it->is_array()) return "";
  for (const Json& c : *it) {
    if (c.contains("finish_reason") && c["finish_reason"].is_string())
      return c["finish_reason"].get<std::string>();
  }
  return "";
}

std::string Truncate(std::string s, size_t n) {
  if (s.size() > n) s = s.substr(0, n) + "...";
  return s;
}

}  // namespace

StatusOr<ParsedUrl> ParseUrl(const std::string& url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos)
    return InvalidArgument("--url '" + url + "': expected scheme://host[:port][/prefix]");
  const std::string scheme = url.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https")
    return InvalidArgument("--url '" + url + "': scheme must be http or https");
  const size_t path_start = url.find('/', scheme_end + 3);
  ParsedUrl p;
  p.origin = url.substr(0, path_start);
  if (p.origin.size() == scheme_end + 3) return InvalidArgument("--url '" + url + "': no host");
  if (path_start != std::string::npos) p.prefix = url.substr(path_start);
  while (!p.prefix.empty() && p.prefix.back() == '/') p.prefix.pop_back();
  return p;
}

OpenAiClient::OpenAiClient(const ClientOptions& options, ParsedUrl url)
    : options_(options),
      url_(std::move(url)),
      chat_(options.endpoint.find("chat") != std::string::npos),
      http_(std::make_unique<httplib::Client>(url_.origin)) {
  const auto timeout = std::chrono::duration<double>(options_.timeout_s);
  http_->set_connection_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
  http_->set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
  http_->set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
  // A fresh connection per request: servers close kept-alive connections on their own
  // schedule (llama-server, httplib's 5-request limit), and a request sent on a connection the
  // server just closed fails with a read error. Loopback connects are cheap.
  http_->set_keep_alive(false);
  if (!options_.api_key.empty()) http_->set_bearer_token_auth(options_.api_key.c_str());
}

OpenAiClient::~OpenAiClient() = default;

StatusOr<std::unique_ptr<OpenAiClient>> OpenAiClient::Create(const ClientOptions& options) {
  auto url = ParseUrl(options.url);
  if (!url.ok()) return url.status();
  return std::unique_ptr<OpenAiClient>(new OpenAiClient(options, std::move(*url)));
}

StatusOr<std::string> OpenAiClient::FirstModelId() {
  const std::string path = url_.prefix + "/v1/models";
  httplib::Result res = http_->Get(path);
  if (!res) {
    return IoError("GET " + url_.origin + path + ": " + httplib::to_string(res.error()));
  }
  if (res->status != 200) {
    return IoError("GET " + path + ": HTTP " + std::to_string(res->status) + ": " +
                   Truncate(res->body, 300));
  }
  try {
    const Json j = Json::parse(res->body);
    const Json& data = j.at("data");
    if (!data.is_array() || data.empty()) return NotFound("GET " + path + ": no models listed");
    return data[0].at("id").get<std::string>();
  } catch (const std::exception& e) {
    return DataLoss("GET " + path + ": unexpected response: " + e.what());
  }
}

std::string OpenAiClient::RequestBody(const std::string& prompt, int max_tokens) const {
  Json body = {{"model", options_.model},
               {"max_tokens", max_tokens},
               {"temperature", options_.temperature},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (options_.ignore_eos) body["ignore_eos"] = true;
  if (chat_) {
    body["messages"] = Json::array({{{"role", "user"}, {"content", prompt}}});
  } else {
    body["prompt"] = prompt;
  }
  if (!options_.extra_body.empty()) {
    const Json extra = Json::parse(options_.extra_body);
    for (const auto& [key, value] : extra.items()) body[key] = value;
  }
  return body.dump();
}

RequestResult OpenAiClient::Stream(const std::string& prompt, int max_tokens) {
  RequestResult r;
  std::string raw;  // kept for error messages
  Clock::time_point last;
  const Clock::time_point t0 = Clock::now();
  std::string parse_error;
  SseParser parser([&](std::string_view data) {
    if (data == "[DONE]") return true;
    Json chunk = Json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (chunk.is_discarded() || !chunk.is_object()) {
      parse_error = "unparsable stream chunk: " + Truncate(std::string(data), 200);
      return false;
    }
    if (chunk.contains("error")) {
      parse_error = "error in stream: " + Truncate(chunk["error"].dump(), 300);
      return false;
    }
    const std::string text = ChunkText(chunk, chat_);
    if (!text.empty()) {
      const Clock::time_point now = Clock::now();
      if (r.text_chunks == 0) {
        r.ttft_s = Seconds(t0, now);
      } else {
        r.itl_s.push_back(Seconds(last, now));
      }
      last = now;
      ++r.text_chunks;
      r.text += text;
    }
    if (std::string fr = FinishReason(chunk); !fr.empty()) r.finish_reason = fr;
    const auto usage = chunk.find("usage");
    if (usage != chunk.end() && usage->is_object()) {
      r.usage_reported = true;
      r.prompt_tokens = usage->value("prompt_tokens", int64_t{-1});
      r.output_tokens = usage->value("completion_tokens", int64_t{0});
    }
    return true;
  });

  httplib::Request req;
  req.method = "POST";
  req.path = url_.prefix + options_.endpoint;
  req.body = RequestBody(prompt, max_tokens);
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (raw.size() < 4096) raw.append(data, std::min<size_t>(n, 4096 - raw.size()));
    return parser.Feed(std::string_view(data, n));
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = http_->send(req, res, err);
  if (sent) parser.Finish();
  r.e2e_s = Seconds(t0, Clock::now());
  r.http_status = sent ? res.status : 0;
  if (!parse_error.empty()) {
    r.error = parse_error;
  } else if (!sent) {
    r.error = "HTTP request failed: " + httplib::to_string(err);
  } else if (res.status != 200) {
    r.error = "HTTP " + std::to_string(res.status) + ": " + Truncate(raw, 300);
  } else if (r.text_chunks == 0) {
    r.error = "the stream carried no text";
  } else {
    r.ok = true;
    if (!r.usage_reported) r.output_tokens = r.text_chunks;
  }
  return r;
}

}  // namespace peng::benchclient
