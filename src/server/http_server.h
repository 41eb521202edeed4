// HttpServer: an event-driven HTTP/1.1 server (Boost.Beast over Asio) for the OpenAI front end.
// A few I/O threads serve every connection, so long SSE streams and idle keep-alive clients
// cost a socket and a little memory each, never a thread. What it guarantees, whatever the
// application does:
//   - a real listen backlog, SO_REUSEADDR but never SO_REUSEPORT;
//   - a connection cap: connections beyond it get 503 and are closed;
//   - timeouts: idle keep-alive, request headers (slowloris), request body, each write;
//   - limits: header bytes (431), body bytes for sized and chunked bodies alike (413),
//     response bytes queued for a client that does not read (the connection is dropped);
//   - after an early answer (the Handler's OnHeaders, a limit, a parse error) the connection
//     is closed, the unread body drained for a short while first, so a keep-alive peer can
//     never smuggle a second request inside a rejected body.
// The application sees whole requests (Handler::OnRequest) and answers through a Responder,
// from any thread: one complete response, or a chunked stream.
//
// Thread-safety: Bind/Serve/Stop from the owner; Responder methods from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace peng::server::http {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0 = any free port
  int backlog = 1024;              // listen(2) backlog (the kernel caps it at somaxconn)
  int io_threads = 2;
  size_t max_connections = 4096;   // lowered to fit the open-file limit
  size_t max_header_bytes = 64 << 10;
  size_t max_body_bytes = size_t{8} << 20;
  size_t max_queued_bytes = size_t{16} << 20;  // unsent response bytes per connection
  std::chrono::milliseconds idle_timeout{60000};    // keep-alive wait for a next request
  std::chrono::milliseconds header_timeout{10000};  // first byte -> end of headers
  std::chrono::milliseconds body_timeout{60000};    // end of headers -> end of body
  std::chrono::milliseconds write_timeout{60000};   // one write to the client
};

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent, with the query
  std::string path;    // target without the query
  Headers headers;
  std::string body;    // empty in Handler::OnHeaders
  bool has_body = false;  // a Content-Length > 0 or a chunked body follows the headers
  // Case-insensitive header lookup; "" when absent.
  std::string Header(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  Headers headers;
};

// One request's way back to its client. Every method may be called from any thread; the work
// runs on the connection's strand. Exactly one of Send() or BeginStream()..End() per request.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void Send(Response response) = 0;
  virtual void BeginStream(int status, std::string content_type, Headers headers) = 0;
  virtual void Write(std::string data) = 0;  // one chunk of the stream (empty: ignored)
  virtual void End() = 0;                    // ends the stream
  // Runs `fn` on the connection's strand (dropped if the connection is gone).
  virtual void Post(std::function<void()> fn) = 0;
  // `fn` runs once, on the strand, if the client goes away (hang-up, failed or timed-out
  // write, too many unread bytes) before the response ended. Replaces an earlier one.
  virtual void OnClientGone(std::function<void()> fn) = 0;
};

class Handler {
 public:
  virtual ~Handler() = default;
  // Called with the request line and headers, before the body is read: an answer to send at
  // once instead of reading the body (the connection then closes if a body was coming).
  virtual std::optional<Response> OnHeaders(const Request& head) = 0;
  // A whole request. Called on the connection's strand; must not block.
  virtual void OnRequest(Request request, std::shared_ptr<Responder> responder) = 0;
};

class HttpServer {
 public:
  HttpServer(Handler* handler, HttpOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens.
  Status Bind();
  int port() const;
  // Runs the I/O threads until Stop().
  Status Serve();
  // From now on every response says "Connection: close".
  void SetClosing();
  // Closes the listener and every connection; Serve() returns. Idempotent.
  void Stop();
  size_t connections() const;
  const HttpOptions& options() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace peng::server::http
