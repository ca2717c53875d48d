#include "services/http/openai_server.h"

#include <csignal>

#include "absl/strings/str_format.h"
#include "common/json.h"
#include "common/metrics/http_server.h"
#include "httplib.h"
#include "services/http/openai_protocol.h"

namespace tandem::http {
namespace {

using router::GenerationServiceImpl;

constexpr char kJson[] = "application/json";

void SendError(const absl::Status& status, httplib::Response& res,
               absl::Duration retry_after = absl::Seconds(1)) {
  const ApiError e = ApiErrorFrom(status);
  res.status = e.http_status;
  if (e.http_status == 429 || e.http_status == 503) {
    const int64_t secs =
        std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(retry_after, absl::Seconds(1))));
    res.set_header("Retry-After", std::to_string(secs));
  }
  res.set_content(ApiErrorJson(e), kJson);
}

// Non-streaming: collects the messages. A client that goes away is not
// noticed until the call ends (bounded by max_tokens).
class CollectSink final : public router::GenerateSink {
 public:
  explicit CollectSink(ResponseBuilder* builder) : builder_(builder) {}
  bool Write(const tandem::v1::GenerateResponse& r) override {
    builder_->Add(r);
    return true;
  }
  void WriteLast(const tandem::v1::GenerateResponse& r) override { builder_->Add(r); }
  bool IsCancelled() override { return false; }
  // No disconnect check: the handler waits for the call's events only.
  absl::Time NextCheck() override { return absl::InfiniteFuture(); }

 private:
  ResponseBuilder* builder_;
};

// Streaming: SSE events on the chunked response.
class SseSink final : public router::GenerateSink {
 public:
  SseSink(httplib::DataSink* sink, ResponseBuilder* builder, absl::Duration ping_interval)
      : sink_(sink), builder_(builder), ping_interval_(ping_interval) {}
  bool Write(const tandem::v1::GenerateResponse& r) override {
    return Send(builder_->Chunk(r, /*last=*/false));
  }
  void WriteLast(const tandem::v1::GenerateResponse& r) override {
    Send(builder_->Chunk(r, /*last=*/true));
  }
  // Idle: an SSE comment (clients ignore it) tells whether the peer is gone;
  // the write after the peer's reset fails.
  bool IsCancelled() override {
    if (broken_) return true;
    if (absl::Now() - last_write_ >= ping_interval_) Send(": ping\n\n");
    return broken_;
  }
  // Only a ping can find the peer gone: no wakeup before the next is due.
  absl::Time NextCheck() override { return last_write_ + ping_interval_; }
  bool Send(const std::string& data) {
    if (broken_) return false;
    last_write_ = absl::Now();
    if (!sink_->write(data.data(), data.size())) broken_ = true;
    return !broken_;
  }
  bool broken() const { return broken_; }

 private:
  httplib::DataSink* sink_;
  ResponseBuilder* builder_;
  absl::Duration ping_interval_;
  absl::Time last_write_ = absl::Now();
  bool broken_ = false;
};

// What a streaming response's content provider keeps alive.
struct StreamState {
  OpenAiRequest request;
  std::unique_ptr<GenerationServiceImpl::AdmittedCall> call;
  std::unique_ptr<ResponseBuilder> builder;
};

}  // namespace

absl::StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Start(Options options) {
  if (options.generation == nullptr)
    return absl::InvalidArgumentError("http: no generation service");
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError("--http-port must be in [0, 65535]");
  }
  std::signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<OpenAiServer> s(new OpenAiServer());
  s->options_ = std::move(options);
  s->created_ = absl::ToUnixSeconds(absl::Now());
  s->server_ = std::make_unique<httplib::Server>();
  s->Install();
  const Options& o = s->options_;
  if (o.port == 0) {
    s->port_ = s->server_->bind_to_any_port(o.host);
  } else {
    s->port_ = s->server_->bind_to_port(o.host, o.port) ? o.port : -1;
  }
  if (s->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrFormat("HTTP server: cannot listen on %s:%d", o.host, o.port));
  }
  httplib::Server* server = s->server_.get();
  s->thread_ = metrics::StartListening(server);
  return s;
}

OpenAiServer::~OpenAiServer() { Stop(); }

void OpenAiServer::Stop() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

namespace {

// Errors cpp-httplib answers itself (413 body too large, 404 no route, 400
// unreadable request) get OpenAI's JSON shape too.
httplib::Server::HandlerResponse ShapeHttplibError(const httplib::Request&,
                                                   httplib::Response& res) {
  if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
  absl::Status s;
  switch (res.status) {
    case 413:
      s = absl::InvalidArgumentError("the request body is too large");
      break;
    case 404:
      s = absl::NotFoundError("no such endpoint");
      break;
    case 405:
      s = absl::InvalidArgumentError("method not allowed");
      break;
    default:
      s = absl::InvalidArgumentError(absl::StrFormat("bad request (HTTP %d)", res.status));
  }
  const int status = res.status;
  SendError(s, res);
  res.status = status;
  return httplib::Server::HandlerResponse::Handled;
}

}  // namespace

void OpenAiServer::Install() {
  httplib::Server& svr = *server_;
  const Options& o = options_;
  const int threads = std::max(1, o.num_threads);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(o.max_body_bytes);
  svr.set_read_timeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(o.read_timeout)));
  svr.set_write_timeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(o.write_timeout)));
  svr.set_keep_alive_max_count(100);
  svr.set_error_handler(httplib::Server::HandlerWithResponse(ShapeHttplibError));
  svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Generate(Endpoint::kCompletions, req, res);
  });
  svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Generate(Endpoint::kChat, req, res);
  });
  svr.Get("/v1/models",
          [this](const httplib::Request& req, httplib::Response& res) { Models(req, res); });
  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) { Health(res); });
}

bool OpenAiServer::Authenticate(const httplib::Request& req, httplib::Response& res) const {
  const bool has = req.has_header("Authorization");
  const std::string value = has ? req.get_header_value("Authorization") : "";
  absl::Status s = options_.generation->AuthenticateHeader(has ? &value : nullptr);
  if (s.ok()) return true;
  if (!has) {
    s = absl::UnauthenticatedError(
        "missing API key: send the header 'Authorization: Bearer <key>'");
  }
  SendError(s, res);
  return false;
}

void OpenAiServer::Generate(Endpoint endpoint, const httplib::Request& req,
                            httplib::Response& res) const {
  if (!Authenticate(req, res)) return;
  GenerationServiceImpl* gen = options_.generation;
  const std::string& model = gen->options().model_name;
  const absl::Duration retry_after = gen->options().retry_after;
  absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(endpoint, req.body, model);
  if (!parsed.ok()) {
    if (metrics::TandemMetrics* m = gen->options().metrics; m != nullptr) {
      m->RequestErrors(parsed.status().code())->Inc();
    }
    SendError(parsed.status(), res, retry_after);
    return;
  }
  absl::StatusOr<std::unique_ptr<GenerationServiceImpl::AdmittedCall>> call =
      gen->Admit(parsed->request);
  if (!call.ok()) {
    SendError(call.status(), res, retry_after);
    return;
  }
  if (!parsed->stream) {
    ResponseBuilder builder(*parsed, model, gen->options().tokenizer, created_);
    CollectSink sink(&builder);
    absl::Status s = gen->Stream(**call, absl::InfiniteFuture(), &sink);
    call->reset();
    if (!s.ok()) {
      SendError(s, res, retry_after);
      return;
    }
    res.set_content(builder.Body(), kJson);
    return;
  }
  auto state = std::make_shared<StreamState>();
  state->request = std::move(parsed).value();
  state->call = std::move(call).value();
  state->builder =
      std::make_unique<ResponseBuilder>(state->request, model, gen->options().tokenizer, created_);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [gen, state, ping = options_.ping_interval](
                                                            size_t, httplib::DataSink& out) {
    SseSink sink(&out, state->builder.get(), ping);
    absl::Status s = gen->Stream(*state->call, absl::InfiniteFuture(), &sink);
    state->call.reset();  // the KV is free before the connection is
    if (sink.broken()) return false;
    if (!s.ok()) {
      const std::string e = ResponseBuilder::ErrorEvent(ApiErrorFrom(s));
      if (!out.write(e.data(), e.size())) return false;
    }
    out.done();
    return true;
  });
}

void OpenAiServer::Models(const httplib::Request& req, httplib::Response& res) const {
  if (!Authenticate(req, res)) return;
  const GenerationServiceImpl::Options& g = options_.generation->options();
  tandem::json::Json card = {{"id", g.model_name},
                             {"object", "model"},
                             {"created", created_},
                             {"owned_by", "tandem"},
                             {"max_model_len", g.limits.context_length}};
  tandem::json::Json body = {{"object", "list"}, {"data", tandem::json::Json::array({card})}};
  res.set_content(tandem::json::Dump(body), kJson);
}

void OpenAiServer::Health(httplib::Response& res) const {
  if (options_.generation->draining()) {
    SendError(absl::UnavailableError("the router is draining (shutting down)"), res);
  } else if (options_.ready && !options_.ready()) {
    SendError(absl::UnavailableError("no live workers can take requests yet"), res);
  } else {
    res.set_content("{\"status\":\"ok\"}", kJson);
  }
}

}  // namespace tandem::http
