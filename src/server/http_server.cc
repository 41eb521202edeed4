#include "server/http_server.h"

#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cstdio>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace peng::server::http {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr auto kWatchEvery = std::chrono::milliseconds(250);   // client hang-up poll
constexpr auto kLingerFor = std::chrono::seconds(2);            // draining before a close
constexpr size_t kLingerMaxBytes = size_t{64} << 20;

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

const char* Reason(int status) {
  return bhttp::obsolete_reason(static_cast<bhttp::status>(status)).data();
}

std::string ErrorBody(const std::string& message, const char* type, const char* code) {
  // The OpenAI error shape, for the errors this layer answers by itself.
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped += '\\';
    escaped += c;
  }
  return std::string(R"({"error":{"code":")") + code + R"(","message":")" + escaped +
         R"(","param":null,"type":")" + type + R"("}})";
}

Response ErrorResponse(int status, const std::string& message, const char* code) {
  Response r;
  r.status = status;
  r.body = ErrorBody(message, status >= 500 ? "service_unavailable" : "invalid_request_error",
                     code);
  return r;
}

// Bytes of a whole response (status line, headers, body).
std::string Serialize(const Response& r, bool keep_alive) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + Reason(r.status) + "\r\n";
  if (!r.content_type.empty()) out += "Content-Type: " + r.content_type + "\r\n";
  for (const auto& [k, v] : r.headers) out += k + ": " + v + "\r\n";
  out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  out += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  out += r.body;
  return out;
}

}  // namespace

std::string Request::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (IEquals(k, name)) return v;
  }
  return "";
}

class HttpServer::Impl {
 public:
  Impl(Handler* handler, HttpOptions options)
      : handler_(handler),
        opt_(std::move(options)),
        acceptor_(ioc_),
        retry_(ioc_),
        work_(net::make_work_guard(ioc_)) {}
  ~Impl() {
    // Connections still queued in the io_context go first, while everything they use lives.
    ioc_.stop();
    beast::error_code ec;
    acceptor_.close(ec);
  }

  Status Bind();
  Status Serve();
  void Stop();
  void Accept();
  // Live connections, so that Stop() can close them (each closes on its own strand).
  void Register(void* key, std::function<void()> close_fn) {
    std::lock_guard<std::mutex> lock(live_mu_);
    live_[key] = std::move(close_fn);
  }
  void Unregister(void* key) {
    std::lock_guard<std::mutex> lock(live_mu_);
    live_.erase(key);
  }

  // Declared before the io_context: connections still queued in it when it is destroyed
  // update connections_ from their destructors.
  std::atomic<size_t> connections_{0};
  std::atomic<bool> closing_{false};
  std::atomic<bool> stopped_{false};
  Handler* handler_;
  HttpOptions opt_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  net::steady_timer retry_;  // accept back-off when out of file descriptors
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work_;
  std::mutex live_mu_;
  std::unordered_map<void*, std::function<void()>> live_;
  int port_ = 0;
};

namespace {

class Connection : public Responder, public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, HttpServer::Impl* srv)
      : stream_(std::move(socket)), srv_(srv), watch_(stream_.get_executor()) {
    ++srv_->connections_;
  }
  ~Connection() override {
    srv_->Unregister(this);
    --srv_->connections_;
  }

  void Start(bool over_capacity) {
    std::weak_ptr<Connection> weak = shared_from_this();
    srv_->Register(this, [weak] {
      if (auto c = weak.lock()) c->Post([c] { c->CloseWhenWritten(); });
    });
    if (over_capacity) {
      Enqueue(Serialize(ErrorResponse(503, "Too many connections", "too_many_connections"),
                        false));
      close_after_ = true;
      Flush();
      return;
    }
    ReadRequest();
  }

  // Responder: every call hops onto the strand.
  void Send(Response response) override {
    Post([self = shared_from_this(), r = std::move(response)]() mutable {
      self->DoSend(std::move(r));
    });
  }
  void BeginStream(int status, std::string content_type, Headers headers) override {
    Post([self = shared_from_this(), status, ct = std::move(content_type),
          h = std::move(headers)]() mutable { self->DoBeginStream(status, ct, h); });
  }
  void Write(std::string data) override {
    if (data.empty()) return;
    Post([self = shared_from_this(), d = std::move(data)]() mutable { self->DoChunk(d); });
  }
  void End() override {
    Post([self = shared_from_this()] { self->DoEnd(); });
  }
  void Post(std::function<void()> fn) override {
    net::post(stream_.get_executor(), std::move(fn));
  }
  void OnClientGone(std::function<void()> fn) override {
    Post([self = shared_from_this(), f = std::move(fn)]() mutable {
      if (self->closed_) {
        if (f) f();
      } else {
        self->gone_ = std::move(f);
      }
    });
  }

 private:
  enum class State { kReading, kHandling, kClosing };

  // --- reading -----------------------------------------------------------------------------
  void ReadRequest() {
    state_ = State::kReading;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(srv_->opt_.max_header_bytes));
    parser_->body_limit(srv_->opt_.max_body_bytes);
    if (buffer_.size() > 0) return ReadHeader();  // pipelined
    stream_.expires_after(srv_->opt_.idle_timeout);
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec) return self->Close();  // idle timeout or hang-up
                              self->buffer_.commit(n);
                              self->ReadHeader();
                            });
  }

  void ReadHeader() {
    stream_.expires_after(srv_->opt_.header_timeout);
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = shared_from_this()](beast::error_code ec, size_t) {
                               self->OnHeader(ec);
                             });
  }

  // An error while reading a request: answer it if it is the client's, then close.
  void FailRead(beast::error_code ec) {
    if (ec == bhttp::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted) {
      return Close();
    }
    if (ec == beast::error::timeout) return Close();  // tcp_stream closed the socket already
    if (ec == bhttp::error::header_limit) {
      return Reject(ErrorResponse(431, "Request headers too large", "headers_too_large"));
    }
    if (ec == bhttp::error::body_limit) {
      return Reject(ErrorResponse(413, "Request body too large", "request_too_large"));
    }
    return Reject(ErrorResponse(400, "Malformed HTTP request: " + ec.message(), "bad_request"));
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return FailRead(ec);
    const auto& msg = parser_->get();
    request_ = Request();
    request_.method = std::string(msg.method_string());
    request_.target = std::string(msg.target());
    request_.path = request_.target.substr(0, request_.target.find('?'));
    for (const auto& f : msg) {
      request_.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    }
    request_.has_body = !parser_->is_done();
    keep_alive_ = msg.keep_alive();
    if (std::optional<Response> early = srv_->handler_->OnHeaders(request_)) {
      if (request_.has_body) return Reject(std::move(*early));
      return Answer(std::move(*early));
    }
    if (const auto len = parser_->content_length(); len && *len > srv_->opt_.max_body_bytes) {
      return Reject(ErrorResponse(413, "Request body too large", "request_too_large"));
    }
    if (request_.has_body && IEquals(request_.Header("Expect"), "100-continue")) {
      Enqueue("HTTP/1.1 100 Continue\r\n\r\n");
      Flush();
    }
    ReadBody();
  }

  void ReadBody() {
    stream_.expires_after(srv_->opt_.body_timeout);
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return self->FailRead(ec);
                        self->Dispatch();
                      });
  }

  void Dispatch() {
    request_.body = std::move(parser_->get().body());
    parser_.reset();
    state_ = State::kHandling;
    exchange_open_ = true;
    stream_.expires_never();
    Watch();
    srv_->handler_->OnRequest(std::move(request_), shared_from_this());
  }

  // While a request is being answered, notices a client that hung up.
  void Watch() {
    watch_.expires_after(kWatchEvery);
    watch_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || !self->exchange_open_ || self->closed_) return;
      pollfd p{};
      p.fd = self->stream_.socket().native_handle();
      p.events = POLLRDHUP;
      if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) {
        return self->Close();
      }
      self->Watch();
    });
  }

  // --- writing -----------------------------------------------------------------------------
  bool KeepAlive() const { return keep_alive_ && !srv_->closing_; }

  // A complete answer to the current request (early or not).
  void Answer(Response r) {
    exchange_open_ = false;
    gone_ = nullptr;
    Enqueue(Serialize(r, KeepAlive()));
    close_after_ = !KeepAlive();
    next_after_flush_ = !close_after_;
    Flush();
  }

  // An early answer: the rest of the request is not read; the connection closes after it.
  void Reject(Response r) {
    exchange_open_ = false;
    gone_ = nullptr;
    Enqueue(Serialize(r, false));
    close_after_ = true;
    Flush();
  }

  void DoSend(Response r) {
    if (!exchange_open_ || closed_ || streaming_) return;
    Answer(std::move(r));
  }

  void DoBeginStream(int status, const std::string& content_type, const Headers& headers) {
    if (!exchange_open_ || closed_ || streaming_) return;
    streaming_ = true;
    std::string head = "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) + "\r\n";
    head += "Content-Type: " + content_type + "\r\n";
    for (const auto& [k, v] : headers) head += k + ": " + v + "\r\n";
    head += "Transfer-Encoding: chunked\r\n";
    head += KeepAlive() ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    stream_keep_alive_ = KeepAlive();
    Enqueue(std::move(head));
    Flush();
  }

  void DoChunk(const std::string& data) {
    if (!exchange_open_ || closed_ || !streaming_) return;
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
    Enqueue(size + data + "\r\n");
    Flush();
  }

  void DoEnd() {
    if (!exchange_open_ || closed_ || !streaming_) return;
    streaming_ = false;
    exchange_open_ = false;
    gone_ = nullptr;
    Enqueue("0\r\n\r\n");
    close_after_ = !stream_keep_alive_;
    next_after_flush_ = stream_keep_alive_;
    Flush();
  }

  void Enqueue(std::string bytes) {
    queued_bytes_ += bytes.size();
    out_.push_back(std::move(bytes));
    if (queued_bytes_ > srv_->opt_.max_queued_bytes) Close();  // a client that does not read
  }

  void Flush() {
    if (writing_ || closed_) return;
    if (out_.empty()) {
      if (close_after_) return Linger();
      if (next_after_flush_) {
        next_after_flush_ = false;
        ReadRequest();
      }
      return;
    }
    writing_ = true;
    in_flight_.clear();
    while (!out_.empty() && in_flight_.size() < 64) {
      in_flight_.push_back(std::move(out_.front()));
      out_.pop_front();
    }
    std::vector<net::const_buffer> bufs;
    for (const std::string& s : in_flight_) bufs.emplace_back(s.data(), s.size());
    // The stream's timer is free: reads are not pending while a response is written.
    if (state_ != State::kReading) stream_.expires_after(srv_->opt_.write_timeout);
    net::async_write(stream_, bufs, [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->writing_ = false;
      self->queued_bytes_ -= n;
      self->in_flight_.clear();
      if (ec) return self->Close();
      // An expired timer would fail the next operation at once (say, a stream's next chunk
      // after a long wait for tokens): disarm it until the next read or write arms it again.
      if (self->state_ != State::kReading) self->stream_.expires_never();
      self->Flush();
    });
  }

  // Closes after the last response: stop sending, then read and drop what the client still
  // sends for a moment, so that it sees our answer instead of a reset.
  void Linger() {
    if (closed_) return;
    state_ = State::kClosing;
    exchange_open_ = false;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(kLingerFor);
    LingerRead();
  }

  void LingerRead() {
    stream_.async_read_some(net::buffer(discard_, sizeof(discard_)),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->lingered_ += n;
                              if (ec || self->lingered_ > kLingerMaxBytes) return self->Close();
                              self->LingerRead();
                            });
  }

  // Server stop: a response still being written is finished first (then the connection
  // lingers and closes); anything else closes now.
  void CloseWhenWritten() {
    if (closed_) return;
    if (!exchange_open_ && (writing_ || !out_.empty())) {
      close_after_ = true;
      next_after_flush_ = false;
      return;
    }
    Close();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    watch_.cancel();
    if (exchange_open_ && gone_) {
      auto f = std::move(gone_);
      gone_ = nullptr;
      f();
    }
    gone_ = nullptr;
    exchange_open_ = false;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  beast::tcp_stream stream_;
  HttpServer::Impl* srv_;
  net::steady_timer watch_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  Request request_;
  State state_ = State::kReading;
  bool keep_alive_ = true;
  bool exchange_open_ = false;   // a request is being answered
  bool streaming_ = false;
  bool stream_keep_alive_ = true;
  bool close_after_ = false;      // close once the queue is written
  bool next_after_flush_ = false; // read the next request once the queue is written
  bool writing_ = false;
  bool closed_ = false;
  std::function<void()> gone_;
  std::deque<std::string> out_;
  std::vector<std::string> in_flight_;
  size_t queued_bytes_ = 0;
  size_t lingered_ = 0;
  char discard_[16384];
};

// The open-file limit decides how many connections can exist at all: raise the soft limit to
// the hard one.
size_t RaiseFileLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  return static_cast<size_t>(rl.rlim_cur);
}

}  // namespace

Status HttpServer::Impl::Bind() {
  const size_t files = RaiseFileLimit();
  // Keep files for the model, logs and the accept of a connection that is then refused.
  const size_t fit = files > 256 ? files - 128 : files / 2;
  opt_.max_connections = std::min(opt_.max_connections, fit);
  beast::error_code ec;
  const auto addr = net::ip::make_address(opt_.host, ec);
  if (ec) return InvalidArgument("invalid host address '" + opt_.host + "': " + ec.message());
  const tcp::endpoint ep(addr, static_cast<unsigned short>(opt_.port));
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(opt_.backlog, ec);
  if (ec) {
    beast::error_code ignored;
    acceptor_.close(ignored);
    if (opt_.port == 0) return IoError("cannot bind " + opt_.host + " to a free port");
    return IoError("cannot bind " + opt_.host + ":" + std::to_string(opt_.port) +
                   " (is another server using the port?): " + ec.message());
  }
  port_ = acceptor_.local_endpoint().port();
  Accept();
  return OkStatus();
}

void HttpServer::Impl::Accept() {
  acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket s) {
    if (ec == net::error::operation_aborted || stopped_) return;
    if (ec) {  // e.g. out of file descriptors: back off instead of spinning
      std::fprintf(stderr, "peng: accept failed: %s\n", ec.message().c_str());
      retry_.expires_after(std::chrono::milliseconds(100));
      retry_.async_wait([this](beast::error_code e) {
        if (!e && !stopped_) Accept();
      });
      return;
    }
    beast::error_code ignored;
    s.set_option(tcp::no_delay(true), ignored);
    const bool over = connections_.load() >= opt_.max_connections;
    auto conn = std::make_shared<Connection>(std::move(s), this);
    conn->Post([conn, over] { conn->Start(over); });  // everything of a connection on its strand
    Accept();
  });
}

Status HttpServer::Impl::Serve() {
  if (!acceptor_.is_open()) return IoError("the server is not bound");
  if (stopped_) return OkStatus();
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, opt_.io_threads); ++i) threads.emplace_back([this] { ioc_.run(); });
  ioc_.run();
  for (auto& t : threads) t.join();
  beast::error_code ec;
  acceptor_.close(ec);  // the port is free once Serve() returns
  return OkStatus();
}

void HttpServer::Impl::Stop() {
  if (stopped_.exchange(true)) return;
  // Close the listener and every connection on their own executors, give them up to 2 s to
  // finish (their cancelled operations complete), then stop the I/O threads.
  net::post(ioc_, [this] {
    beast::error_code ec;
    acceptor_.close(ec);
    retry_.cancel();
  });
  std::vector<std::function<void()>> closers;
  {
    std::lock_guard<std::mutex> lock(live_mu_);
    for (auto& [key, close_fn] : live_) closers.push_back(close_fn);
  }
  for (auto& close_fn : closers) close_fn();  // unlocked: a connection may die in here
  work_.reset();
  // Not called on an I/O thread: waiting here is fine.
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard<std::mutex> lock(live_mu_);
      if (live_.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ioc_.stop();
}

HttpServer::HttpServer(Handler* handler, HttpOptions options)
    : impl_(std::make_unique<Impl>(handler, std::move(options))) {}

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Bind() { return impl_->Bind(); }
int HttpServer::port() const { return impl_->port_; }
Status HttpServer::Serve() { return impl_->Serve(); }
void HttpServer::SetClosing() { impl_->closing_ = true; }
void HttpServer::Stop() { impl_->Stop(); }
size_t HttpServer::connections() const { return impl_->connections_.load(); }
const HttpOptions& HttpServer::options() const { return impl_->opt_; }

}  // namespace peng::server::http
