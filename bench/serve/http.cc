// The OpenAI-compatible backend of `tandem bench`: POST /v1/completions with
// stream=true on cpp-httplib's client (one connection per request), parsing
// the server-sent events as they arrive. Every wait is bounded by the
// request deadline.
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/serve/backend.h"
#include "common/json.h"

namespace tandem::bench {

std::vector<std::string> SseParser::Feed(std::string_view bytes) {
  pending_.append(bytes);
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view line(pending_.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.substr(0, 5) == "data:") {
      line.remove_prefix(5);
      if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      out.emplace_back(line);
    }
  }
  pending_.erase(0, start);
  return out;
}

namespace {

constexpr size_t kMaxResponseBytes = 64 << 20;

// The remaining time to `deadline` as a chrono duration (at least 1 ms).
std::chrono::milliseconds Left(absl::Time deadline) {
  return std::chrono::milliseconds(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

std::string ErrorName(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
      return "CONNECT";
    case httplib::Error::Read:
      return "RECV";
    case httplib::Error::Write:
      return "SEND";
    default:
      return absl::StrCat("HTTP_", httplib::to_string(e));
  }
}

// The /v1/completions request: greedy, streamed, with the usage chunk.
json::Json Body(const std::string& model, const BenchRequest& request) {
  json::Json body = {{"model", model},
                     {"max_tokens", request.max_tokens},
                     {"temperature", 0},
                     {"stream", true},
                     {"ignore_eos", request.ignore_eos},
                     {"stream_options", {{"include_usage", true}}}};
  if (request.prompt_ids.empty()) {
    body["prompt"] = request.prompt_text;
  } else {
    body["prompt"] = request.prompt_ids;
  }
  return body;
}

// One streamed completion: the HTTP status, the server-sent events as they
// arrive (timings, usage, finish reason) and how the stream ended.
class StreamReader {
 public:
  StreamReader(const BenchRequest& request, absl::Time deadline)
      : deadline_(deadline), t0_(absl::Now()) {
    r_.prompt_tokens = request.expected_prompt_tokens;
  }

  int status = 0;  // set by the response handler

  // The body bytes as they come; false stops the transfer.
  bool OnBytes(std::string_view data) {
    total_ += data.size();
    if (total_ > kMaxResponseBytes) return Stop("TOO_LARGE", "response over 64 MiB");
    if (absl::Now() >= deadline_) return Stop("DEADLINE_EXCEEDED", "deadline");
    if (status != 200) {
      error_body_.append(data.substr(0, 200 - std::min<size_t>(200, error_body_.size())));
      return true;
    }
    for (const std::string& event : sse_.Feed(data)) {
      if (!OnEvent(event)) return false;
    }
    return true;
  }

  // The record once the client returned `res`.
  RequestRecord Finish(const httplib::Result& res) {
    if (!done_) {
      if (!stream_error_.empty()) return Fail(stream_error_, error_body_);
      if (status != 0 && status != 200) return Fail(absl::StrCat("HTTP_", status), error_body_);
      if (!res) {
        return Fail(absl::Now() >= deadline_ ? "DEADLINE_EXCEEDED" : ErrorName(res.error()),
                    httplib::to_string(res.error()));
      }
    }
    r_.e2e_ms = absl::ToDoubleMilliseconds(absl::Now() - t0_);
    r_.output_tokens = usage_tokens_ >= 0 ? usage_tokens_ : r_.num_chunks;
    if (r_.num_chunks == 0) return Fail("NO_TOKENS", "stream ended without text");
    r_.ok = true;
    r_.error_code = "OK";
    return r_;
  }

 private:
  bool Stop(std::string code, std::string body) {
    stream_error_ = std::move(code);
    error_body_ = std::move(body);
    return false;
  }

  RequestRecord Fail(std::string code, std::string msg) {
    r_.e2e_ms = absl::ToDoubleMilliseconds(absl::Now() - t0_);
    r_.error_code = std::move(code);
    r_.error_message = std::move(msg);
    return r_;
  }

  // One `data:` payload; false ends the stream ([DONE] or malformed).
  bool OnEvent(const std::string& data) {
    if (data == "[DONE]") {
      done_ = true;
      return false;
    }
    absl::StatusOr<json::Json> v = json::Parse(data);
    if (!v.ok() || !v->is_object()) return Stop("SSE_MALFORMED", data.substr(0, 200));
    if (auto u = v->find("usage"); u != v->end() && u->is_object()) ReadUsage(*u);
    auto choices = v->find("choices");
    if (choices == v->end() || !choices->is_array() || choices->empty()) return true;
    const json::Json& ch = (*choices)[0];
    if (!ch.is_object()) return true;
    if (auto fr = ch.find("finish_reason"); fr != ch.end() && fr->is_string()) {
      r_.finish_reason = fr->get<std::string>();
    }
    auto text = ch.find("text");
    if (text == ch.end() || !text->is_string() || text->get_ref<const std::string&>().empty()) {
      return true;
    }
    const double now_ms = absl::ToDoubleMilliseconds(absl::Now() - t0_);
    if (r_.num_chunks == 0) {
      r_.ttft_ms = now_ms;
    } else {
      r_.itl_ms.push_back(now_ms - last_ms_);
    }
    last_ms_ = now_ms;
    ++r_.num_chunks;
    return true;
  }

  void ReadUsage(const json::Json& u) {
    if (auto n = u.find("completion_tokens"); n != u.end() && n->is_number()) {
      usage_tokens_ = n->get<int64_t>();
    }
    if (auto n = u.find("prompt_tokens"); n != u.end() && n->is_number()) {
      r_.prompt_tokens = n->get<int64_t>();
    }
  }

  const absl::Time deadline_;
  const absl::Time t0_;
  RequestRecord r_;
  std::string error_body_;
  std::string stream_error_;  // set when the receiver stops the transfer
  bool done_ = false;
  SseParser sse_;
  int64_t usage_tokens_ = -1;
  double last_ms_ = 0;
  size_t total_ = 0;
};

class OpenAiHttpBackend : public Backend {
 public:
  OpenAiHttpBackend(std::string host, std::string port, std::string path, std::string model)
      : host_(std::move(host)),
        port_(std::move(port)),
        path_(std::move(path)),
        model_(std::move(model)) {}

  absl::StatusOr<ServerInfo> Probe(absl::Time deadline) override {
    httplib::Client c = Client(deadline);
    // Any HTTP answer shows the server is up (it may not serve GET /).
    httplib::Result res = c.Get("/health");
    if (!res) {
      return absl::UnavailableError(absl::StrCat("connect ", host_, ":", port_,
                                                 " failed: ", httplib::to_string(res.error())));
    }
    ServerInfo info;
    info.model = model_;
    return info;
  }

  RequestRecord Send(const BenchRequest& request, absl::Time deadline) override {
    StreamReader reader(request, deadline);
    httplib::Request req;
    req.method = "POST";
    req.path = path_;
    req.headers = {{"Accept", "text/event-stream"}};
    req.body = json::Dump(Body(model_, request));
    req.set_header("Content-Type", "application/json");
    req.response_handler = [&](const httplib::Response& res) {
      reader.status = res.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      return reader.OnBytes(std::string_view(data, n));
    };
    httplib::Client c = Client(deadline);
    httplib::Result res = c.send(req);
    return reader.Finish(res);
  }

 private:
  httplib::Client Client(absl::Time deadline) const {
    int port = 80;
    (void)absl::SimpleAtoi(port_, &port);  // checked in MakeOpenAiHttpBackend
    httplib::Client c(host_, port);
    c.set_connection_timeout(Left(deadline));
    c.set_read_timeout(Left(deadline));
    c.set_write_timeout(Left(deadline));
    c.set_keep_alive(false);
    return c;
  }

  std::string host_, port_, path_, model_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeOpenAiHttpBackend(const std::string& url,
                                                               const std::string& model) {
  std::string_view rest = url;
  if (rest.substr(0, 7) != "http://") {
    return absl::InvalidArgumentError("--backend openai-http needs an http:// URL");
  }
  rest.remove_prefix(7);
  const size_t slash = rest.find('/');
  std::string hostport(rest.substr(0, slash));
  std::string path = slash == std::string_view::npos ? "" : std::string(rest.substr(slash));
  while (!path.empty() && path.back() == '/') path.pop_back();
  if (path.size() < 12 || path.substr(path.size() - 12) != "/completions") {
    path += path.size() >= 3 && path.substr(path.size() - 3) == "/v1" ? "/completions"
                                                                      : "/v1/completions";
  }
  std::string host = hostport, port = "80";
  if (const size_t colon = hostport.rfind(':'); colon != std::string::npos) {
    host = hostport.substr(0, colon);
    port = hostport.substr(colon + 1);
  }
  if (host.empty()) return absl::InvalidArgumentError("--backend openai-http: no host in URL");
  if (int p = 0; !absl::SimpleAtoi(port, &p) || p < 1 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend openai-http: bad port '", port, "' in URL"));
  }
  return std::make_unique<OpenAiHttpBackend>(host, port, path, model);
}

}  // namespace tandem::bench
