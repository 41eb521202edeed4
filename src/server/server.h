// Server: the OpenAI-compatible HTTP front end of an Engine, on the event-driven HttpServer
// (http_server.h). Routes:
//   POST /v1/completions, POST /v1/chat/completions  (JSON or SSE streaming)
//   GET  /v1/models, GET /health, GET /metrics (Prometheus text), GET /openapi.json
// I/O threads only move bytes; a small worker pool parses JSON, renders chat templates and
// tokenizes, then Submit()s to the engine; the engine thread notifies each request's
// connection when tokens are ready (no thread waits on a request). A client that goes away
// (hang-up, failed write) has its requests aborted, freeing their KV blocks. Errors use
// OpenAI's error JSON: 400 bad input, 401 wrong API key, 404 unknown route or model, 413 body too large, 429 queue full, 431 headers too large, 500 a request that
// failed inside the engine, 503 draining or too many connections.
//
// Lifecycle: Bind() -> Serve() (blocks) ... Shutdown() from any thread: /health and new
// generation requests answer 503 at once, the running requests finish (bounded by
// drain_timeout; then they are aborted), the last responses are written, the listener and
// every connection close and Serve() returns. Stop() does the same without waiting. The
// Engine outlives the Server.
//
// Thread-safety: Shutdown(), Stop(), port() and draining() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "core/status.h"
#include "engine/engine.h"
#include "server/grammar_cache.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/protocol.h"

namespace peng::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                          // 0 = any free port (see port())
  std::string api_key;                      // empty = no authentication
  bool protect_metrics = false;             // /metrics needs the API key too
  std::string served_model_name = "peng";
  size_t max_body_bytes = size_t{8} << 20;  // larger bodies get 413 (sized or chunked)
  size_t max_connections = 4096;            // more get 503 (capped by the open-file limit)
  int io_threads = 2;                       // threads moving bytes
  int worker_threads = 2;                   // threads parsing / templating / tokenizing
  std::chrono::milliseconds idle_timeout{60000};    // keep-alive connection without a request
  std::chrono::milliseconds header_timeout{10000};  // to receive a request's headers
  std::chrono::milliseconds drain_timeout{30000};   // Shutdown(): running requests get this
  // Tool-call syntax of the model (tool_calls.h); kAuto: detected from the chat template.
  ToolCallFormat tool_call_parser = ToolCallFormat::kAuto;
};

class Server : public http::Handler {
 public:
  Server(Engine* engine, ServerOptions options);
  ~Server() override;
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket.
  Status Bind();
  int port() const { return http_->port(); }
  // Accepts connections until Shutdown() or Stop(). Returns an error if the listener failed.
  Status Serve();
  // Graceful drain, then stops. Idempotent; blocks until stopped.
  void Shutdown();
  // Stops at once: running requests are aborted (their streams get finish "abort", waited for
  // at most 2 s), connections closed.
  void Stop();
  bool draining() const { return draining_.load(); }

  std::string MetricsText() const;
  const ServerOptions& options() const { return options_; }

 private:
  class Task;

  std::optional<http::Response> OnHeaders(const http::Request& head) override;
  void OnRequest(http::Request request, std::shared_ptr<http::Responder> out) override;
  bool Authorized(const http::Request& req) const;
  http::Response Models() const;
  // Worker pool: parse, template, tokenize, submit; then the connection's strand takes over.
  void StartGeneration(http::Request request, std::shared_ptr<http::Responder> out, bool chat);
  MaybeError Prepare(const http::Request& request, bool chat, ParsedRequest* req) const;
  void TaskStarted();
  void TaskEnded();

  Engine* engine_;
  ServerOptions options_;
  ServerMetrics metrics_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopped_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  // Waits until no generation request is being answered, or until deadline.
  void WaitForHandlers(std::chrono::steady_clock::time_point deadline);

  int active_ = 0;  // generation requests still being answered; guarded by mu_
  int64_t created_ = 0;
  std::unique_ptr<GrammarCache> grammars_;  // compiled structured-output grammars
  // Destroyed first (explicitly, in ~Server): their queued work refers to the members above.
  std::unique_ptr<http::HttpServer> http_;
  class Workers;
  std::unique_ptr<Workers> workers_;
};

}  // namespace peng::server
