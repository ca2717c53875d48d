// The OpenAI HTTP front door on Boost.Beast / Asio: the only translation unit
// of the tree that includes them (docs/architecture.md).
//
// One Connection per accepted socket, all of its handlers on its own strand
// (any of the io threads). A connection reads one request at a time
// (request_parser: header and body limits), answers it, then waits for the
// next (keep-alive) or closes. A Generate call registers a CallQueue
// notifier that posts Pump() to the strand; Pump turns the queued events into
// bytes (CallStream::Next) and writes them, one write in flight at a time.
// A streaming call also has a ping timer: an SSE comment after ping_interval
// without a write, whose failed write finds a client that has gone away.
//
// Lifetime: the server's registry holds every open connection (that is the
// connection bound); pending handlers hold it too. A connection leaves the
// registry in CloseNow, after its call has ended (ClearNotify, then the
// AdmittedCall goes). Stop stops the io_context, joins the io threads, then
// ends the calls of the connections still open: after that no notifier can
// post, and the io_context's destruction drops the rest.
#include "services/http/openai_server.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/strand.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/core/string.hpp"
#include "boost/beast/core/tcp_stream.hpp"
#include "boost/beast/http.hpp"
#include "common/json.h"
#include "services/http/openai_protocol.h"
#include "spdlog/spdlog.h"

namespace tandem::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using router::CallStream;
using router::GenerationServiceImpl;

namespace {

constexpr char kJson[] = "application/json";
// A connection beyond max_connections: its 503 is written and the connection
// closed within this. More such refusals in progress than kMaxRefusing: the
// connection is closed unanswered.
constexpr std::chrono::seconds kRefuseTimeout(2);
constexpr int kMaxRefusing = 64;
// After an accept error (out of file descriptors): wait before the next.
constexpr std::chrono::milliseconds kAcceptBackoff(100);
constexpr size_t kReadChunk = 4096;
constexpr char kLastChunk[] = "0\r\n\r\n";

std::chrono::nanoseconds ToChrono(absl::Duration d) { return absl::ToChronoNanoseconds(d); }

// Beast 1.74's string_view is Boost's.
std::string_view View(beast::string_view s) { return {s.data(), s.size()}; }

using Response = bhttp::response<bhttp::string_body>;

// The bytes of a whole response (Content-Length set); `head_only`: the
// header alone (the answer to HEAD).
std::string Serialize(Response& res, bool head_only) {
  res.prepare_payload();
  std::ostringstream os;
  if (head_only) {
    os << res.base();
  } else {
    os << res;
  }
  return std::move(os).str();
}

// An OpenAI error JSON response for `status`; `http_status` (0 = from
// `status`) overrides the code. 429 and 503 carry Retry-After.
Response ErrorResponse(const absl::Status& status, absl::Duration retry_after,
                       int http_status = 0) {
  const ApiError e = ApiErrorFrom(status);
  Response res;
  res.result(static_cast<unsigned>(http_status != 0 ? http_status : e.http_status));
  if (res.result_int() == 499) res.reason("Client Closed Request");
  if (e.http_status == 429 || e.http_status == 503) {
    const int64_t secs =
        std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(retry_after, absl::Seconds(1))));
    res.set(bhttp::field::retry_after, std::to_string(secs));
  }
  res.set(bhttp::field::content_type, kJson);
  res.body() = ApiErrorJson(e);
  return res;
}

// `data` as one chunk of a chunked body (or as is, unchunked).
std::string Frame(std::string_view data, bool chunked) {
  if (!chunked || data.empty()) return std::string(data);
  return absl::StrFormat("%x\r\n%s\r\n", data.size(), data);
}

// One Generate call of a connection: the parsed request, the admitted call,
// and what turns its events into OpenAI's shapes. Heap-allocated, so the
// references between them stay valid.
struct CallState {
  OpenAiRequest request;
  std::unique_ptr<GenerationServiceImpl::AdmittedCall> admitted;
  std::optional<ResponseBuilder> builder;  // refers to `request`
  std::optional<CallStream> stream;        // refers to `*admitted`
};

class Connection;

}  // namespace

struct OpenAiServer::Impl {
  explicit Impl(Options o) : options(std::move(o)) {}
  absl::Status Listen();
  void Accept();
  void OnAccept(beast::error_code ec, tcp::socket socket);
  // Registers `c`; false at the bound or once stopping.
  bool Add(const std::shared_ptr<Connection>& c);
  void Remove(Connection* c);
  void Stop();

  const Options options;
  int64_t created = 0;
  int port = 0;
  std::atomic<int> refusing{0};  // refusals in progress
  absl::Mutex mu;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  // Declared after what connections touch: their last ones may go with it.
  net::io_context ioc;
  tcp::acceptor acceptor{net::make_strand(ioc)};
  net::steady_timer accept_backoff{acceptor.get_executor()};
  absl::flat_hash_map<Connection*, std::shared_ptr<Connection>> live ABSL_GUARDED_BY(mu);
  std::vector<std::thread> threads;
};

namespace {

class Connection final : public std::enable_shared_from_this<Connection> {
 public:
  Connection(OpenAiServer::Impl* server, tcp::socket socket)
      : server_(server),
        options_(server->options),
        stream_(std::move(socket)),
        ping_timer_(stream_.get_executor()) {}
  ~Connection();
  // Serves requests (on the connection's strand).
  void Start();
  // Answers 503 (too many connections) and closes.
  void Refuse();
  // Stop, the io threads joined: ends the call and closes.
  void Abort();

 private:
  GenerationServiceImpl& generation() const { return *options_.generation; }
  absl::Duration retry_after() const { return generation().options().retry_after; }

  // Reading a request: the first bytes within the idle (keep-alive) or read
  // timeout, then the whole request within read_timeout.
  void WaitRequest();
  void ReadHeader();
  void OnHeader(beast::error_code ec);
  void ReadBody();
  void OnRequest(beast::error_code ec);
  void OnReadError(beast::error_code ec);
  void Handle();

  // Whole responses; then the next request, or close.
  void Reply(Response res);
  void ReplyError(const absl::Status& status, int http_status = 0);
  bool Authenticate();
  void Generate(Endpoint endpoint);
  void Models();
  void Health();

  // An admitted call: notifier, ping timer, the events -> bytes.
  void BeginCall(std::unique_ptr<CallState> call);
  void Pump();
  void PumpStream();
  void PumpCollect();
  void EndCall();
  // The next ping check: `after` from now.
  void SchedulePing(absl::Duration after);
  void OnPing(beast::error_code ec);

  // Writes: `bytes` go after what is queued; `last`: the response ends there.
  void Send(std::string bytes, bool last);
  void Flush();
  void OnWrite(beast::error_code ec);
  void AfterResponse();
  // Errors: shut down sending, read and drop the rest for a while (so the
  // client, still sending, sees the response, not a reset), then close.
  void Linger(std::chrono::nanoseconds timeout);
  void Drain();
  void CloseNow();

  OpenAiServer::Impl* const server_;
  const OpenAiServer::Options& options_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  bhttp::request<bhttp::string_body> request_;
  net::steady_timer ping_timer_;
  std::unique_ptr<CallState> call_;
  std::string out_;      // the write in flight
  std::string pending_;  // written after it
  std::string drain_;    // Linger's read buffer
  absl::Time last_write_;
  bool writing_ = false;
  bool response_done_ = false;  // pending_ / out_ end the response
  bool first_request_ = true;
  bool keep_alive_ = true;
  bool chunked_ = true;
  bool linger_ = false;  // after the response: Linger, not keep-alive
  bool refused_ = false;
  bool closed_ = false;
};

Connection::~Connection() {
  if (call_ != nullptr) EndCall();
  if (refused_) server_->refusing.fetch_sub(1);
}

void Connection::Start() {
  net::post(stream_.get_executor(), [self = shared_from_this()] { self->WaitRequest(); });
}

void Connection::Refuse() {
  refused_ = true;
  server_->refusing.fetch_add(1);
  net::post(stream_.get_executor(), [self = shared_from_this()] {
    self->stream_.expires_after(kRefuseTimeout);
    self->linger_ = true;
    self->ReplyError(absl::UnavailableError(absl::StrFormat(
        "the server has %d connections open (its bound); retry", self->options_.max_connections)));
  });
}

void Connection::Abort() {
  closed_ = true;
  if (call_ != nullptr) {
    call_->admitted->CancelForClient();
    EndCall();
  }
  beast::error_code ignored;
  stream_.socket().close(ignored);
}

void Connection::WaitRequest() {
  request_ = {};  // an error answered before the next request is whole: HTTP/1.1, not HEAD
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(options_.max_header_bytes));
  parser_->body_limit(options_.max_body_bytes);
  if (buffer_.size() > 0) {  // a pipelined request's first bytes are here
    ReadHeader();
    return;
  }
  stream_.expires_after(ToChrono(first_request_ ? options_.read_timeout : options_.idle_timeout));
  stream_.async_read_some(buffer_.prepare(kReadChunk),
                          [self = shared_from_this()](beast::error_code ec, size_t n) {
                            if (ec) {
                              self->CloseNow();
                              return;
                            }
                            self->buffer_.commit(n);
                            self->ReadHeader();
                          });
}

void Connection::ReadHeader() {
  // From the first byte, the whole request (header, 100 Continue, body).
  stream_.expires_after(ToChrono(options_.read_timeout));
  bhttp::async_read_header(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
}

void Connection::OnHeader(beast::error_code ec) {
  if (ec) {
    OnReadError(ec);
    return;
  }
  const auto& header = parser_->get();
  if (parser_->is_done() || !beast::iequals(header[bhttp::field::expect], "100-continue")) {
    ReadBody();
    return;
  }
  static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
  net::async_write(stream_, net::buffer(kContinue, sizeof(kContinue) - 1),
                   [self = shared_from_this()](beast::error_code ec, size_t) {
                     if (ec) {
                       self->CloseNow();
                       return;
                     }
                     self->ReadBody();
                   });
}

void Connection::ReadBody() {
  if (parser_->is_done()) {
    OnRequest({});
    return;
  }
  bhttp::async_read(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRequest(ec); });
}

void Connection::OnRequest(beast::error_code ec) {
  if (ec) {
    OnReadError(ec);
    return;
  }
  first_request_ = false;
  stream_.expires_never();
  request_ = parser_->release();
  parser_.reset();
  keep_alive_ = request_.keep_alive();
  Handle();
}

void Connection::OnReadError(beast::error_code ec) {
  if (ec == bhttp::error::header_limit) {
    linger_ = true;
    ReplyError(
        absl::InvalidArgumentError(absl::StrFormat(
            "the request header is too large (at most %d bytes)", options_.max_header_bytes)),
        431);
  } else if (ec == bhttp::error::body_limit) {
    linger_ = true;
    ReplyError(absl::InvalidArgumentError("the request body is too large"), 413);
  } else if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category() &&
             ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
    linger_ = true;  // a malformed request
    ReplyError(absl::InvalidArgumentError(absl::StrFormat("bad request: %s", ec.message())), 400);
  } else {
    CloseNow();  // closed, reset or timed out: nobody to answer
  }
}

void Connection::Handle() {
  std::string_view target = View(request_.target());
  target = target.substr(0, target.find('?'));
  const bhttp::verb method = request_.method();
  // HEAD is GET without the body.
  auto only = [&](bhttp::verb allowed) {
    const bool get = allowed == bhttp::verb::get;
    if (method == allowed || (get && method == bhttp::verb::head)) return true;
    Response res =
        ErrorResponse(absl::InvalidArgumentError("method not allowed"), retry_after(), 405);
    res.set(bhttp::field::allow, get ? "GET, HEAD" : "POST");
    Reply(std::move(res));
    return false;
  };
  if (target == "/v1/completions" || target == "/v1/chat/completions") {
    if (only(bhttp::verb::post)) {
      Generate(target == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChat);
    }
  } else if (target == "/v1/models") {
    if (only(bhttp::verb::get)) Models();
  } else if (target == "/health") {
    if (only(bhttp::verb::get)) Health();
  } else {
    ReplyError(absl::NotFoundError("no such endpoint"));
  }
}

void Connection::Reply(Response res) {
  res.version(request_.version() == 10 ? 10 : 11);
  res.keep_alive(keep_alive_ && !linger_);
  Send(Serialize(res, request_.method() == bhttp::verb::head), /*last=*/true);
}

void Connection::ReplyError(const absl::Status& status, int http_status) {
  Reply(ErrorResponse(status, retry_after(), http_status));
}

bool Connection::Authenticate() {
  const auto it = request_.find(bhttp::field::authorization);
  const bool has = it != request_.end();
  const std::string value = has ? std::string(View(it->value())) : "";
  absl::Status s = generation().AuthenticateHeader(has ? &value : nullptr);
  if (s.ok()) return true;
  if (!has) {
    s = absl::UnauthenticatedError(
        "missing API key: send the header 'Authorization: Bearer <key>'");
  }
  ReplyError(s);
  return false;
}

void Connection::Generate(Endpoint endpoint) {
  if (!Authenticate()) return;
  GenerationServiceImpl& gen = generation();
  absl::StatusOr<OpenAiRequest> parsed =
      ParseOpenAiRequest(endpoint, request_.body(), gen.options().model_name);
  request_.body().clear();
  request_.body().shrink_to_fit();
  if (!parsed.ok()) {
    if (metrics::TandemMetrics* m = gen.options().metrics; m != nullptr) {
      m->RequestErrors(parsed.status().code())->Inc();
    }
    ReplyError(parsed.status());
    return;
  }
  absl::StatusOr<std::unique_ptr<GenerationServiceImpl::AdmittedCall>> admitted =
      gen.Admit(parsed->request);
  if (!admitted.ok()) {
    ReplyError(WithOpenAiParam(endpoint, admitted.status()));
    return;
  }
  auto call = std::make_unique<CallState>();
  call->request = std::move(parsed).value();
  call->admitted = std::move(admitted).value();
  call->builder.emplace(call->request, gen.options().model_name, gen.options().tokenizer,
                        server_->created);
  call->stream.emplace(call->admitted.get());
  BeginCall(std::move(call));
}

void Connection::Models() {
  if (!Authenticate()) return;
  const GenerationServiceImpl::Options& g = generation().options();
  tandem::json::Json card = {{"id", g.model_name},
                             {"object", "model"},
                             {"created", server_->created},
                             {"owned_by", "tandem"},
                             {"max_model_len", g.limits.context_length}};
  tandem::json::Json body = {{"object", "list"}, {"data", tandem::json::Json::array({card})}};
  Response res;
  res.set(bhttp::field::content_type, kJson);
  res.body() = tandem::json::Dump(body);
  Reply(std::move(res));
}

void Connection::Health() {
  if (generation().draining()) {
    ReplyError(absl::UnavailableError("the router is draining (shutting down)"));
  } else if (options_.ready && !options_.ready()) {
    ReplyError(absl::UnavailableError("no live workers can take requests yet"));
  } else {
    Response res;
    res.set(bhttp::field::content_type, kJson);
    res.body() = "{\"status\":\"ok\"}";
    Reply(std::move(res));
  }
}

void Connection::BeginCall(std::unique_ptr<CallState> call) {
  call_ = std::move(call);
  if (call_->request.stream) {
    // HTTP/1.0 has no chunked encoding: the stream ends with the connection.
    chunked_ = request_.version() >= 11;
    if (!chunked_) keep_alive_ = false;
    bhttp::response<bhttp::empty_body> res(bhttp::status::ok, request_.version());
    res.set(bhttp::field::content_type, "text/event-stream");
    res.set(bhttp::field::cache_control, "no-cache");
    res.keep_alive(keep_alive_);
    if (chunked_) res.chunked(true);
    std::ostringstream header;
    header << res.base();
    Send(std::move(header).str(), /*last=*/false);
    SchedulePing(options_.ping_interval);
  }
  // From here every event the backend pushes posts Pump() to the strand (the
  // notifier runs once now too). A weak reference: the registry and the
  // pending handlers own the connection, the queue does not.
  std::weak_ptr<Connection> weak = weak_from_this();
  auto strand = stream_.get_executor();
  call_->admitted->queue().SetNotify([weak, strand] {
    if (std::shared_ptr<Connection> self = weak.lock()) {
      net::post(strand, [self = std::move(self)] { self->Pump(); });
    }
  });
}

void Connection::Pump() {
  if (closed_ || call_ == nullptr) return;
  if (call_->request.stream) {
    PumpStream();
  } else {
    PumpCollect();
  }
}

void Connection::PumpStream() {
  if (writing_) return;  // OnWrite pumps again: events wait in the CallQueue meanwhile
  std::string bytes;
  bool last = false;
  while (!last) {
    CallStream::Step step = call_->stream->Next();
    if (step.kind == CallStream::Step::kNone) break;
    std::string events;
    if (step.kind == CallStream::Step::kError) {
      events = ResponseBuilder::ErrorEvent(ApiErrorFrom(step.status));
    } else {
      last = step.kind == CallStream::Step::kFinal;
      events = call_->builder->Chunk(step.response, last);
    }
    last = last || step.kind == CallStream::Step::kError;
    bytes += Frame(events, chunked_);
  }
  if (last) {
    if (chunked_) bytes += kLastChunk;
    EndCall();  // the KV is free before the connection is
  }
  if (!bytes.empty() || last) Send(std::move(bytes), last);
}

void Connection::PumpCollect() {
  while (true) {
    CallStream::Step step = call_->stream->Next();
    switch (step.kind) {
      case CallStream::Step::kNone:
        return;
      case CallStream::Step::kToken:
        call_->builder->Add(step.response);
        break;
      case CallStream::Step::kError:
        EndCall();
        ReplyError(step.status);
        return;
      case CallStream::Step::kFinal: {
        call_->builder->Add(step.response);
        Response res;
        res.set(bhttp::field::content_type, kJson);
        res.body() = call_->builder->Body();
        EndCall();
        Reply(std::move(res));
        return;
      }
    }
  }
}

void Connection::EndCall() {
  // ClearNotify first: no Pump is posted after it, and the AdmittedCall (the
  // in-flight slots, the backend call) goes next.
  call_->admitted->queue().ClearNotify();
  call_.reset();
  ping_timer_.cancel();
}

void Connection::SchedulePing(absl::Duration after) {
  ping_timer_.expires_after(ToChrono(std::max(after, absl::Milliseconds(1))));
  ping_timer_.async_wait([self = shared_from_this()](beast::error_code ec) { self->OnPing(ec); });
}

void Connection::OnPing(beast::error_code ec) {
  if (ec || closed_ || call_ == nullptr) return;
  // Only a write finds a client gone; none is due before ping_interval
  // without one.
  if (!writing_ && absl::Now() - last_write_ >= options_.ping_interval) {
    Send(Frame(": ping\n\n", chunked_), /*last=*/false);
  }
  SchedulePing(writing_ ? options_.ping_interval
                        : last_write_ + options_.ping_interval - absl::Now());
}

void Connection::Send(std::string bytes, bool last) {
  if (closed_) return;
  pending_ += bytes;
  if (last) response_done_ = true;
  Flush();
}

void Connection::Flush() {
  if (writing_ || pending_.empty()) return;
  out_.swap(pending_);
  pending_.clear();
  writing_ = true;
  last_write_ = absl::Now();
  if (!refused_) stream_.expires_after(ToChrono(options_.write_timeout));
  net::async_write(
      stream_, net::buffer(out_),
      [self = shared_from_this()](beast::error_code ec, size_t) { self->OnWrite(ec); });
}

void Connection::OnWrite(beast::error_code ec) {
  writing_ = false;
  out_.clear();
  if (ec) {  // the client went away, or did not read for write_timeout
    CloseNow();
    return;
  }
  if (!pending_.empty()) {
    Flush();
    return;
  }
  if (response_done_) {
    response_done_ = false;
    AfterResponse();
    return;
  }
  Pump();  // a stream: the events that came during the write
}

void Connection::AfterResponse() {
  if (linger_) {
    Linger(refused_ ? kRefuseTimeout : ToChrono(options_.read_timeout));
  } else if (!keep_alive_) {
    CloseNow();
  } else {
    WaitRequest();
  }
}

void Connection::Linger(std::chrono::nanoseconds timeout) {
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream_.expires_after(timeout);
  drain_.resize(16 << 10);
  Drain();
}

void Connection::Drain() {
  stream_.async_read_some(net::buffer(drain_),
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            if (ec) {
                              self->CloseNow();  // EOF, reset or the timeout
                            } else {
                              self->Drain();
                            }
                          });
}

void Connection::CloseNow() {
  if (closed_) return;
  closed_ = true;
  if (call_ != nullptr) {  // the client is gone mid-call
    call_->admitted->CancelForClient();
    EndCall();
  }
  ping_timer_.cancel();
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.close();
  server_->Remove(this);  // the running handler still holds the connection
}

}  // namespace

absl::Status OpenAiServer::Impl::Listen() {
  const Options& o = options;
  auto fail = [&](const beast::error_code& ec) {
    return absl::UnavailableError(
        absl::StrFormat("HTTP server: cannot listen on %s:%d: %s", o.host, o.port, ec.message()));
  };
  beast::error_code ec;
  tcp::resolver resolver(ioc);
  const auto results = resolver.resolve(
      o.host, std::to_string(o.port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec) return fail(ec);
  if (results.empty()) return fail(net::error::host_not_found);
  const tcp::endpoint endpoint = results.begin()->endpoint();
  if (acceptor.open(endpoint.protocol(), ec); ec) return fail(ec);
  if (acceptor.set_option(net::socket_base::reuse_address(true), ec); ec) return fail(ec);
  if (acceptor.bind(endpoint, ec); ec) return fail(ec);
  if (acceptor.listen(net::socket_base::max_listen_connections, ec); ec) return fail(ec);
  port = acceptor.local_endpoint(ec).port();
  if (ec) return fail(ec);
  return absl::OkStatus();
}

void OpenAiServer::Impl::Accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    OnAccept(ec, std::move(socket));
  });
}

void OpenAiServer::Impl::OnAccept(beast::error_code ec, tcp::socket socket) {
  if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
  if (ec) {  // e.g. out of file descriptors: not a busy loop
    spdlog::warn("HTTP server: accept failed: {}", ec.message());
    accept_backoff.expires_after(kAcceptBackoff);
    accept_backoff.async_wait([this](beast::error_code wait_ec) {
      if (!wait_ec) Accept();
    });
    return;
  }
  beast::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);  // SSE chunks go out at once
  auto c = std::make_shared<Connection>(this, std::move(socket));
  if (Add(c)) {
    c->Start();
  } else if (refusing.load() < kMaxRefusing) {
    c->Refuse();
  }  // else: closed unanswered as `c` goes
  Accept();
}

bool OpenAiServer::Impl::Add(const std::shared_ptr<Connection>& c) {
  absl::MutexLock lock(&mu);
  if (stopped || live.size() >= static_cast<size_t>(std::max(1, options.max_connections))) {
    return false;
  }
  live.emplace(c.get(), c);
  return true;
}

void OpenAiServer::Impl::Remove(Connection* c) {
  std::shared_ptr<Connection> last;  // goes after the lock is released
  absl::MutexLock lock(&mu);
  if (auto it = live.find(c); it != live.end()) {
    last = std::move(it->second);
    live.erase(it);
  }
}

void OpenAiServer::Impl::Stop() {
  {
    absl::MutexLock lock(&mu);
    if (stopped) return;
    stopped = true;
  }
  ioc.stop();
  for (std::thread& t : threads) t.join();
  threads.clear();
  // No handler runs from here: this thread owns every connection.
  beast::error_code ignored;
  acceptor.close(ignored);
  absl::flat_hash_map<Connection*, std::shared_ptr<Connection>> open;
  {
    absl::MutexLock lock(&mu);
    open.swap(live);
  }
  for (auto& [ptr, c] : open) c->Abort();
}

absl::StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Start(Options options) {
  if (options.generation == nullptr)
    return absl::InvalidArgumentError("http: no generation service");
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError("--http-port must be in [0, 65535]");
  }
  std::signal(SIGPIPE, SIG_IGN);
  auto impl = std::make_unique<Impl>(std::move(options));
  impl->created = absl::ToUnixSeconds(absl::Now());
  if (absl::Status s = impl->Listen(); !s.ok()) return s;
  impl->Accept();
  const int n = std::max(1, impl->options.io_threads);
  for (int i = 0; i < n; ++i) {
    impl->threads.emplace_back([ioc = &impl->ioc] { ioc->run(); });
  }
  return std::unique_ptr<OpenAiServer>(new OpenAiServer(std::move(impl)));
}

OpenAiServer::OpenAiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

OpenAiServer::~OpenAiServer() { Stop(); }

int OpenAiServer::port() const { return impl_->port; }

void OpenAiServer::Stop() { impl_->Stop(); }

}  // namespace tandem::http
