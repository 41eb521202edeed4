#include "server/server.h"

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <ctime>
#include <utility>

#include "server/generation.h"
#include "server/openapi.h"
#include "server/responses.h"

namespace peng::server {
namespace {

using nlohmann::json;

http::Response JsonResponse(int status, const json& body) {
  http::Response r;
  r.status = status;
  r.body = DumpJson(body);
  return r;
}

http::Response ErrorResponse(const ApiError& e) { return JsonResponse(e.http_status, e.ToJson()); }

ApiError MakeError(int status, std::string message, std::string type, std::string code = "") {
  ApiError e;
  e.http_status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

ApiError Draining() {
  return MakeError(503, "The server is shutting down and does not accept new requests",
                   "service_unavailable");
}

bool IsGeneratePath(const std::string& path) {
  return path == "/v1/completions" || path == "/v1/chat/completions";
}

// The routes and their methods; anything else is a 404.
bool KnownRoute(const std::string& method, const std::string& path) {
  if (method == "POST") return IsGeneratePath(path);
  if (method == "GET") {
    return path == "/health" || path == "/metrics" || path == "/v1/models" ||
           path == "/openapi.json";
  }
  return false;
}

// Compares in time that depends on the lengths only, not on where the strings differ.
bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

// The token of "Authorization: Bearer TOKEN" (scheme case-insensitive), or nullopt.
std::optional<std::string> BearerToken(const std::string& header) {
  constexpr std::string_view kScheme = "bearer";
  if (header.size() <= kScheme.size()) return std::nullopt;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(header[i])) != kScheme[i]) return std::nullopt;
  }
  size_t at = kScheme.size();
  if (header[at] != ' ' && header[at] != '\t') return std::nullopt;
  while (at < header.size() && (header[at] == ' ' || header[at] == '\t')) ++at;
  size_t end = header.size();
  while (end > at && (header[end - 1] == ' ' || header[end - 1] == '\t')) --end;
  return header.substr(at, end - at);
}

}  // namespace

// Runs the CPU work of a request (JSON, template, tokenizer) off the I/O threads.
class Server::Workers {
 public:
  explicit Workers(int threads) : pool_(static_cast<size_t>(std::max(1, threads))) {}
  ~Workers() { pool_.join(); }
  template <class F>
  void Post(F&& f) {
    boost::asio::post(pool_, std::forward<F>(f));
  }
  void Stop() { pool_.stop(); }

 private:
  boost::asio::thread_pool pool_;
};

// One generation request being answered: owned by its connection (through the client-gone
// callback) until the answer ended; the engine's notify and the connection's strand reach
// it through weak/shared pointers. Counts as active for the drain while it lives.
class Server::Task : public std::enable_shared_from_this<Server::Task> {
 public:
  Task(Server* server, std::unique_ptr<Generation> gen, std::weak_ptr<http::Responder> out)
      : server_(server), gen_(std::move(gen)), out_(std::move(out)) {
    server_->TaskStarted();
  }
  ~Task() {
    gen_.reset();  // aborts what is still running
    server_->TaskEnded();
  }

  // Wires the engine's notifications to this connection's strand.
  void Start() {
    std::weak_ptr<Task> weak = shared_from_this();
    gen_->SetNotify([weak] {
      auto t = weak.lock();
      if (!t || t->scheduled_.exchange(true)) return;  // one Pump queued is enough
      if (auto out = t->out_.lock()) {
        out->Post([t] {
          t->scheduled_ = false;
          t->Pump();
        });
      }
    });
    if (auto out = out_.lock()) out->Post([t = shared_from_this()] { t->Pump(); });
  }

  // On the strand: forwards what is ready.
  void Pump() {
    auto out = out_.lock();
    if (!out || ended_) return;
    std::string sse;
    const bool done = gen_->Pump(&sse);
    if (gen_->streaming()) {
      if (!began_) {
        began_ = true;
        out->BeginStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
      }
      out->Write(std::move(sse));
      if (done) out->End();
    } else if (done) {
      out->Send(gen_->error() ? ErrorResponse(*gen_->error()) : JsonResponse(200, gen_->Result()));
    }
    if (done) {
      ended_ = true;
      gen_->SetNotify({});
      out->OnClientGone({});  // releases this task
    }
  }

  void ClientGone() {
    ended_ = true;
    gen_->Abort();
  }

 private:
  Server* server_;
  std::unique_ptr<Generation> gen_;
  std::weak_ptr<http::Responder> out_;
  std::atomic<bool> scheduled_{false};
  bool began_ = false;
  bool ended_ = false;
};

Server::Server(Engine* engine, ServerOptions options)
    : engine_(engine),
      options_(std::move(options)),
      metrics_(options_.served_model_name),
      created_(static_cast<int64_t>(std::time(nullptr))),
      grammars_(std::make_unique<GrammarCache>(engine->tokenizer())),
      http_(std::make_unique<http::HttpServer>(this, [&] {
        http::HttpOptions h;
        h.host = options_.host;
        h.port = options_.port;
        h.io_threads = options_.io_threads;
        h.max_connections = options_.max_connections;
        h.max_body_bytes = options_.max_body_bytes;
        h.idle_timeout = options_.idle_timeout;
        h.header_timeout = options_.header_timeout;
        return h;
      }())),
      workers_(std::make_unique<Workers>(options_.worker_threads)) {}

Server::~Server() {
  workers_->Stop();
  http_->Stop();
  workers_.reset();
  http_.reset();
}

bool Server::Authorized(const http::Request& req) const {
  if (options_.api_key.empty()) return true;
  const std::optional<std::string> token = BearerToken(req.Header("Authorization"));
  return token && ConstantTimeEquals(*token, options_.api_key);
}

std::optional<http::Response> Server::OnHeaders(const http::Request& head) {
  if (!KnownRoute(head.method, head.path)) {
    return ErrorResponse(MakeError(404, "Not found: " + head.method + " " + head.path,
                                   "invalid_request_error", "not_found"));
  }
  const bool needs_key = head.path.rfind("/v1/", 0) == 0 ||
                         (options_.protect_metrics && head.path == "/metrics");
  if (needs_key && !Authorized(head)) {
    return ErrorResponse(MakeError(401, "Incorrect API key provided.", "invalid_request_error",
                                   "invalid_api_key"));
  }
  if (draining_ && IsGeneratePath(head.path)) return ErrorResponse(Draining());
  return std::nullopt;
}

void Server::OnRequest(http::Request req, std::shared_ptr<http::Responder> out) {
  if (req.path == "/health") {  // (503 while draining, and for good once the engine cannot run)
    http::Response r;
    const std::string fatal = engine_->GetStats().fatal_error;
    r.status = draining_ || !fatal.empty() ? 503 : 200;
    r.content_type = "text/plain";
    r.body = draining_ ? "draining" : !fatal.empty() ? "unhealthy: " + fatal : "ok";
    return out->Send(std::move(r));
  }
  if (req.path == "/metrics") {
    http::Response r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = MetricsText();
    return out->Send(std::move(r));
  }
  if (req.path == "/v1/models") return out->Send(Models());
  if (req.path == "/openapi.json") {
    http::Response r;
    r.body = std::string(OpenApiJson());
    return out->Send(std::move(r));
  }
  const bool chat = req.path == "/v1/chat/completions";
  StartGeneration(std::move(req), std::move(out), chat);
}

http::Response Server::Models() const {
  json model = {{"id", options_.served_model_name},
                {"object", "model"},
                {"created", created_},
                {"owned_by", "peng"},
                {"root", engine_->model_config().name},
                {"parent", nullptr},
                {"max_model_len", engine_->max_model_len()}};
  return JsonResponse(200, {{"object", "list"}, {"data", json::array({model})}});
}

MaybeError Server::Prepare(const http::Request& http_req, bool chat, ParsedRequest* req) const {
  nlohmann::ordered_json body;
  if (auto e = ParseJsonBody(http_req.body, &body)) return e;
  if (auto e = ParseRequest(body, chat ? Endpoint::kChat : Endpoint::kCompletions, req)) return e;
  req->tool_format = options_.tool_call_parser;
  if (!req->model.empty() && req->model != options_.served_model_name) {
    ApiError e = MakeError(404, "The model `" + req->model + "` does not exist.",
                           "invalid_request_error", "model_not_found");
    e.param = "model";
    return e;
  }
  PromptLimits limits;
  limits.max_model_len = engine_->max_model_len();
  limits.vocab_size = engine_->model_config().vocab_size;
  if (auto e = PreparePrompts(req, engine_->tokenizer(), limits)) return e;
  if (!req->grammar.empty()) {
    auto g = grammars_->Get(req->grammar);
    if (!g.ok()) {
      return BadRequest(req->grammar_param + ": " + g.status().message(), req->grammar_param,
                        "invalid_value");
    }
    req->compiled_grammar = *g;
  }
  return std::nullopt;
}

void Server::StartGeneration(http::Request http_req, std::shared_ptr<http::Responder> out,
                             bool chat) {
  TaskStarted();  // the drain waits for requests still being prepared too
  workers_->Post([this, http_req = std::move(http_req), out, chat]() mutable {
    struct Done {
      Server* s;
      ~Done() { s->TaskEnded(); }
    } done{this};
    ParsedRequest req;
    MaybeError err;
    try {
      err = Prepare(http_req, chat, &req);
    } catch (const std::exception& e) {  // a template or tokenizer bug fails this request only
      err = MakeError(500, std::string("Internal error preparing the request: ") + e.what(),
                      "internal_error");
    }
    if (err) return out->Send(ErrorResponse(*err));
    if (draining_) return out->Send(ErrorResponse(Draining()));
    ResponseMeta meta;
    meta.endpoint = chat ? Endpoint::kChat : Endpoint::kCompletions;
    meta.id = NewResponseId(meta.endpoint);
    meta.created = static_cast<int64_t>(std::time(nullptr));
    meta.model = options_.served_model_name;
    auto gen = std::make_unique<Generation>(engine_, &metrics_, std::move(req), meta);
    if (auto e = gen->Submit()) {
      return out->Send(ErrorResponse(draining_ && e->http_status == 429 ? Draining() : *e));
    }
    auto task = std::make_shared<Task>(this, std::move(gen), out);
    // The connection owns the task until the answer ended or the client left.
    out->OnClientGone([task] { task->ClientGone(); });
    task->Start();
  });
}

void Server::TaskStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  ++active_;
}

void Server::TaskEnded() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--active_ == 0) cv_.notify_all();
}

std::string Server::MetricsText() const {
  return metrics_.Render(engine_->GetStats(), static_cast<int64_t>(http_->connections()));
}

Status Server::Bind() { return http_->Bind(); }

Status Server::Serve() {
  Status s = http_->Serve();
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  cv_.notify_all();
  return s;
}

void Server::Shutdown() {
  if (draining_.exchange(true)) {  // a second caller waits for the first
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stopped_.load(); });
    return;
  }
  http_->SetClosing();
  const auto deadline = std::chrono::steady_clock::now() + options_.drain_timeout;
  if (!engine_->Drain(options_.drain_timeout)) {
    std::fprintf(stderr, "peng: drain timeout (%lld ms): aborting the running requests\n",
                 static_cast<long long>(options_.drain_timeout.count()));
    engine_->Stop();
  }
  WaitForHandlers(deadline + std::chrono::seconds(5));
  http_->Stop();
}

void Server::Stop() {
  draining_ = true;
  http_->SetClosing();
  engine_->Stop();  // every running request ends with finish "abort"
  // A moment for the handlers to write those final events before the connections close
  // (a stream cut without them reads as a broken response, not as an abort).
  WaitForHandlers(std::chrono::steady_clock::now() + std::chrono::seconds(2));
  http_->Stop();
}

void Server::WaitForHandlers(std::chrono::steady_clock::time_point deadline) {
  // Bounded: a client that does not read is not waited for.
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline, [&] { return active_ == 0; });
}

}  // namespace peng::server
