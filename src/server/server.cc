#include "server/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <ctime>
#include <utility>

#include "server/client_socket.h"
#include "server/generation.h"
#include "server/openapi.h"
#include "server/protocol.h"
#include "server/responses.h"

namespace peng::server {
namespace {

using nlohmann::json;

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(DumpJson(e.ToJson()), "application/json");
}

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

}  // namespace

// Counts a generation request as active for the drain, from routing to the last byte.
class Server::ActiveGuard {
 public:
  explicit ActiveGuard(Server* s) : s_(s) {
    std::lock_guard<std::mutex> lock(s_->mu_);
    ++s_->active_;
  }
  ~ActiveGuard() {
    std::lock_guard<std::mutex> lock(s_->mu_);
    if (--s_->active_ == 0) s_->cv_.notify_all();
  }

 private:
  Server* s_;
};

Server::Server(Engine* engine, ServerOptions options)
    : engine_(engine),
      options_(std::move(options)),
      metrics_(options_.served_model_name),
      http_(std::make_unique<httplib::Server>()),
      created_(static_cast<int64_t>(std::time(nullptr))) {
  const size_t threads = static_cast<size_t>(std::max(options_.http_threads, 4));
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_tcp_nodelay(true);
  Route();
}

Server::~Server() {
  if (http_->is_running()) http_->stop();
}

bool Server::Authorized(const httplib::Request& req) const {
  if (options_.api_key.empty()) return true;
  return req.get_header_value("Authorization") == "Bearer " + options_.api_key;
}

void Server::Route() {
  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path.rfind("/v1/", 0) == 0 && !Authorized(req)) {
      SendError(res, MakeError(401, "Incorrect API key provided.", "invalid_request_error",
                               "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (draining_ && IsGeneratePath(req.path)) {
      SendError(res, Draining());
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // httplib's own errors (404 no route, 413 too large, 400 bad request line) in OpenAI shape.
  http_->set_error_handler(httplib::Server::HandlerWithResponse(
      [](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 404) {
      SendError(res, MakeError(404, "Not found: " + req.method + " " + req.path,
                               "invalid_request_error", "not_found"));
    } else if (res.status == 413) {
      SendError(res, MakeError(413, "Request body too large", "invalid_request_error",
                               "request_too_large"));
    } else {
      SendError(res, MakeError(res.status, "HTTP error " + std::to_string(res.status),
                               res.status < 500 ? "invalid_request_error" : "internal_error"));
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_->set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        SendError(res, MakeError(500, "Internal error: " + what, "internal_error"));
      });
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.status = draining_ ? 503 : 200;
    res.set_content(draining_ ? "draining" : "ok", "text/plain");
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(MetricsText(), "text/plain; version=0.0.4; charset=utf-8");
  });
  http_->Get("/openapi.json", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(OpenApiJson()), "application/json");
  });
  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    HandleModels(res);
  });
  http_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(req, res, /*chat=*/false);
  });
  http_->Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) {
                HandleGenerate(req, res, /*chat=*/true);
              });
}

void Server::HandleModels(httplib::Response& res) const {
  json model = {{"id", options_.served_model_name},
                {"object", "model"},
                {"created", created_},
                {"owned_by", "peng"},
                {"root", engine_->model_config().name},
                {"parent", nullptr},
                {"max_model_len", engine_->max_model_len()}};
  res.set_content(DumpJson({{"object", "list"}, {"data", json::array({model})}}),
                  "application/json");
}

void Server::HandleGenerate(const httplib::Request& http_req, httplib::Response& res,
                            bool chat) {
  auto guard = std::make_shared<ActiveGuard>(this);
  if (draining_) return SendError(res, Draining());
  json body = json::parse(http_req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    return SendError(res, BadRequest("Invalid JSON in the request body", "", "invalid_json"));
  }
  const Endpoint endpoint = chat ? Endpoint::kChat : Endpoint::kCompletions;
  ParsedRequest req;
  if (auto e = ParseRequest(body, endpoint, &req)) return SendError(res, *e);
  if (!req.model.empty() && req.model != options_.served_model_name) {
    ApiError e = MakeError(404, "The model `" + req.model + "` does not exist.",
                           "invalid_request_error", "model_not_found");
    e.param = "model";
    return SendError(res, e);
  }
  PromptLimits limits;
  limits.max_model_len = engine_->max_model_len();
  limits.vocab_size = engine_->model_config().vocab_size;
  if (auto e = PreparePrompts(&req, engine_->tokenizer(), limits)) return SendError(res, *e);

  ResponseMeta meta;
  meta.endpoint = endpoint;
  meta.id = NewResponseId(endpoint);
  meta.created = static_cast<int64_t>(std::time(nullptr));
  meta.model = options_.served_model_name;
  // The connection's fd, looked up once, the first time it is needed.
  auto client_gone = [addr = http_req.remote_addr, rport = http_req.remote_port,
                      lport = http_req.local_port, fd = -2]() mutable {
    if (fd == -2) fd = FindClientSocket(addr, rport, lport);
    return PeerHungUp(fd);
  };
  const bool stream = req.stream;
  auto gen = std::make_shared<Generation>(engine_, &metrics_, std::move(req), meta, client_gone);
  if (auto e = gen->Submit()) {
    return SendError(res, draining_ && e->http_status == 429 ? Draining() : *e);
  }
  if (!stream) {
    std::optional<json> out = gen->Collect();
    if (!out) {  // client gone; nobody reads this
      res.status = 499;
      return;
    }
    res.set_content(DumpJson(*out), "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [gen, guard](size_t, httplib::DataSink& sink) {
        const bool ok = gen->Stream(
            [&sink](const std::string& s) { return sink.write(s.data(), s.size()); });
        if (ok) sink.done();
        return ok;
      },
      [gen, guard](bool) mutable {
        gen.reset();  // aborts what is still running
        guard.reset();
      });
}

std::string Server::MetricsText() const { return metrics_.Render(engine_->GetStats()); }

Status Server::Bind() {
  // httplib's default socket options include SO_REUSEPORT, which lets a second server bind the
  // same port and silently take half of the connections; keep only SO_REUSEADDR (fast restart).
  http_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof(yes));
  });
  port_ = options_.port;
  if (port_ == 0) {
    port_ = http_->bind_to_any_port(options_.host);
    if (port_ < 0) return IoError("cannot bind " + options_.host + " to a free port");
  } else if (!http_->bind_to_port(options_.host, port_)) {
    return IoError("cannot bind " + options_.host + ":" + std::to_string(port_) +
                   " (is another server using the port?)");
  }
  return OkStatus();
}

Status Server::Serve() {
  if (!http_->listen_after_bind() && !stopped_) {
    return IoError("HTTP listener on port " + std::to_string(port_) + " failed");
  }
  return OkStatus();
}

void Server::Shutdown() {
  if (draining_.exchange(true)) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stopped_.load(); });
    return;
  }
  engine_->Drain();
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return active_ == 0; });
  }
  http_->stop();
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  cv_.notify_all();
}

}  // namespace peng::server
