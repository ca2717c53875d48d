// The OpenAI-compatible backend of `tandem bench`: POST /v1/completions with
// stream=true on cpp-httplib's client (one connection per request), parsing
// the server-sent events as they arrive. Every wait is bounded by the
// request deadline.
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

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
    RequestRecord r;
    r.prompt_tokens = request.expected_prompt_tokens;
    json::Json body = {{"model", model_},
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
    const absl::Time t0 = absl::Now();
    auto fail = [&](std::string code, std::string msg) {
      r.e2e_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
      r.error_code = std::move(code);
      r.error_message = std::move(msg);
      return r;
    };

    int status = 0;
    std::string error_body;
    std::string stream_error;  // set by the receiver when it stops the transfer
    bool done = false;
    SseParser sse;
    int64_t usage_tokens = -1;
    double last_ms = 0;
    size_t total = 0;
    auto on_event = [&](const std::string& data) -> bool {
      if (data == "[DONE]") {
        done = true;
        return false;
      }
      absl::StatusOr<json::Json> v = json::Parse(data);
      if (!v.ok() || !v->is_object()) {
        stream_error = "SSE_MALFORMED";
        error_body = data.substr(0, 200);
        return false;
      }
      if (auto u = v->find("usage"); u != v->end() && u->is_object()) {
        if (auto n = u->find("completion_tokens"); n != u->end() && n->is_number()) {
          usage_tokens = n->get<int64_t>();
        }
        if (auto n = u->find("prompt_tokens"); n != u->end() && n->is_number()) {
          r.prompt_tokens = n->get<int64_t>();
        }
      }
      auto choices = v->find("choices");
      if (choices == v->end() || !choices->is_array() || choices->empty()) return true;
      const json::Json& ch = (*choices)[0];
      if (!ch.is_object()) return true;
      if (auto fr = ch.find("finish_reason"); fr != ch.end() && fr->is_string()) {
        r.finish_reason = fr->get<std::string>();
      }
      auto text = ch.find("text");
      if (text == ch.end() || !text->is_string() || text->get_ref<const std::string&>().empty()) {
        return true;
      }
      const double now_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
      if (r.num_chunks == 0) {
        r.ttft_ms = now_ms;
      } else {
        r.itl_ms.push_back(now_ms - last_ms);
      }
      last_ms = now_ms;
      ++r.num_chunks;
      return true;
    };

    httplib::Request req;
    req.method = "POST";
    req.path = path_;
    req.headers = {{"Accept", "text/event-stream"}};
    req.body = json::Dump(body);
    req.set_header("Content-Type", "application/json");
    req.response_handler = [&](const httplib::Response& res) {
      status = res.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      total += n;
      if (total > kMaxResponseBytes) {
        stream_error = "TOO_LARGE";
        error_body = "response over 64 MiB";
        return false;
      }
      if (absl::Now() >= deadline) {
        stream_error = "DEADLINE_EXCEEDED";
        error_body = "deadline";
        return false;
      }
      if (status != 200) {
        error_body.append(data,
                          std::min<size_t>(n, 200 - std::min<size_t>(200, error_body.size())));
        return true;
      }
      for (const std::string& event : sse.Feed(std::string_view(data, n))) {
        if (!on_event(event)) return false;
      }
      return true;
    };
    httplib::Client c = Client(deadline);
    httplib::Result res = c.send(req);
    if (!done) {
      if (!stream_error.empty()) return fail(stream_error, error_body);
      if (status != 0 && status != 200) return fail(absl::StrCat("HTTP_", status), error_body);
      if (!res) {
        return fail(absl::Now() >= deadline ? "DEADLINE_EXCEEDED" : ErrorName(res.error()),
                    httplib::to_string(res.error()));
      }
    }
    r.e2e_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
    r.output_tokens = usage_tokens >= 0 ? usage_tokens : r.num_chunks;
    if (r.num_chunks == 0) return fail("NO_TOKENS", "stream ended without text");
    r.ok = true;
    r.error_code = "OK";
    return r;
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
