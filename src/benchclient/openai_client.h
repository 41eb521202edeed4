// A minimal client for OpenAI-compatible servers, just enough for the serving benchmark: it
// sends one streaming /v1/completions or /v1/chat/completions request and timestamps every
// streamed chunk that carries text. Works against peng, vLLM, llama.cpp and others.
//
// One OpenAiClient holds one keep-alive HTTP connection: use one per thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace httplib {
class Client;
}

namespace peng::benchclient {

struct ClientOptions {
  std::string url = "http://127.0.0.1:8000";  // scheme://host[:port][/path-prefix]
  std::string endpoint = "/v1/completions";   // a path containing "chat" sends messages
  std::string model;                          // empty: ask /v1/models
  std::string api_key;                        // sent as "Authorization: Bearer ..."
  double temperature = 0.0;
  bool ignore_eos = true;  // vLLM extension; servers that do not know it ignore it
  // A JSON object whose fields are added to (or override) every request body, e.g.
  // {"response_format": {"type": "json_object"}}. Empty = none.
  std::string extra_body;
  double timeout_s = 600;
};

struct RequestResult {
  bool ok = false;
  std::string error;  // why !ok: transport error, HTTP status and body, or no text
  int http_status = 0;
  double start_s = 0;          // when it was sent, seconds after the benchmark start
  double ttft_s = 0;           // send -> first chunk with text
  double e2e_s = 0;            // send -> end of the stream
  std::vector<double> itl_s;   // gaps between successive chunks with text
  int64_t prompt_tokens = -1;  // from usage; -1 when the server did not report it
  int64_t output_tokens = 0;   // from usage, or the number of text chunks without it
  bool usage_reported = false;
  int text_chunks = 0;
  std::string finish_reason;
  std::string text;
};

// "http://h:8000/api" -> origin "http://h:8000", prefix "/api" (trailing '/' dropped).
struct ParsedUrl {
  std::string origin;
  std::string prefix;
};
StatusOr<ParsedUrl> ParseUrl(const std::string& url);

class OpenAiClient {
 public:
  static StatusOr<std::unique_ptr<OpenAiClient>> Create(const ClientOptions& options);
  ~OpenAiClient();

  // The first model id of GET /v1/models.
  StatusOr<std::string> FirstModelId();

  // Sends one streaming request with max_tokens = `max_tokens`. Never throws.
  RequestResult Stream(const std::string& prompt, int max_tokens);

  // The JSON body Stream() sends (exposed for tests).
  std::string RequestBody(const std::string& prompt, int max_tokens) const;

 private:
  OpenAiClient(const ClientOptions& options, ParsedUrl url);

  ClientOptions options_;
  ParsedUrl url_;
  bool chat_;
  std::unique_ptr<httplib::Client> http_;
};

}  // namespace peng::benchclient
