// Server: the OpenAI-compatible HTTP front end of an Engine (cpp-httplib). Routes:
//   POST /v1/completions, POST /v1/chat/completions  (JSON or SSE streaming)
//   GET  /v1/models, GET /health, GET /metrics        (Prometheus text)
// HTTP threads parse JSON, render chat templates, tokenize, Submit() to the engine and write
// the request's stream out; only the engine thread runs the model. A client that goes away
// (failed write, or its socket hung up while waiting) has its request aborted, freeing its KV
// blocks. Errors use OpenAI's error JSON: 400 bad input, 401 wrong API key, 404 unknown route
// or model, 413 body too large, 429 queue full, 503 while draining.
//
// Lifecycle: Bind() -> Serve() (blocks) ... Shutdown() from any thread: /health and new
// requests answer 503, Engine::Drain() finishes the running requests, the handlers finish
// writing, then the listener stops and Serve() returns. The Engine outlives the Server.
//
// Thread-safety: Shutdown(), port() and draining() may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "core/status.h"
#include "engine/engine.h"
#include "server/metrics.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace peng::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                          // 0 = any free port (see port())
  std::string api_key;                      // empty = no authentication
  std::string served_model_name = "peng";
  size_t max_body_bytes = size_t{8} << 20;  // larger bodies get 413
  int http_threads = 64 + 256 + 8;          // one per open connection (streams block one)
};

class Server {
 public:
  Server(Engine* engine, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket.
  Status Bind();
  int port() const { return port_; }
  // Accepts connections until Shutdown(). Returns an error if the listener failed.
  Status Serve();
  // Graceful drain, then stops the listener. Idempotent; blocks until the listener stopped.
  void Shutdown();
  bool draining() const { return draining_.load(); }

  std::string MetricsText() const;
  const ServerOptions& options() const { return options_; }

 private:
  class ActiveGuard;

  void Route();
  bool Authorized(const httplib::Request& req) const;
  void HandleGenerate(const httplib::Request& req, httplib::Response& res, bool chat);
  void HandleModels(httplib::Response& res) const;

  Engine* engine_;
  ServerOptions options_;
  ServerMetrics metrics_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopped_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  int active_ = 0;  // generation requests still being answered; guarded by mu_
  int64_t created_ = 0;
};

}  // namespace peng::server
