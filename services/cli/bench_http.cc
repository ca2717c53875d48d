// The OpenAI-compatible backend of `tandem bench`: POST /v1/completions with
// stream=true over a minimal blocking HTTP/1.1 client (POSIX sockets, one
// connection per request, chunked or identity bodies), parsing the
// server-sent events. Every socket wait is bounded by the request deadline.
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/json.h"
#include "services/cli/bench_backend.h"

namespace tandem::cli::bench {

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

class Connection {
 public:
  ~Connection() {
    if (fd_ >= 0) close(fd_);
  }
  absl::Status Connect(const std::string& host, const std::string& port, absl::Time deadline) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
      return absl::UnavailableError(absl::StrCat("resolve ", host, ": ", gai_strerror(rc)));
    }
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, freeaddrinfo);
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      fd_ = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd_ < 0) continue;
      if (connect(fd_, a->ai_addr, a->ai_addrlen) == 0) {
        deadline_ = deadline;
        return absl::OkStatus();
      }
      close(fd_);
      fd_ = -1;
    }
    return absl::UnavailableError(absl::StrCat("connect ", host, ":", port, " failed"));
  }
  absl::Status WriteAll(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return absl::UnavailableError("send failed");
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }
  // Some bytes, "" at EOF; DEADLINE_EXCEEDED when the deadline passes.
  absl::StatusOr<std::string> Read() {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline_ - absl::Now());
    if (left_ms <= 0) return absl::DeadlineExceededError("deadline");
    pollfd p{fd_, POLLIN, 0};
    const int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1 << 30)));
    if (rc == 0) return absl::DeadlineExceededError("deadline");
    if (rc < 0) return absl::UnavailableError("poll failed");
    char buf[16384];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n < 0) return absl::UnavailableError("recv failed");
    return std::string(buf, static_cast<size_t>(n));
  }

 private:
  int fd_ = -1;
  absl::Time deadline_;
};

// Undoes Transfer-Encoding: chunked incrementally.
class Dechunker {
 public:
  // Appends decoded bytes to `out`; false on malformed framing.
  bool Feed(std::string_view in, std::string& out) {
    buf_.append(in);
    while (true) {
      if (remaining_ == 0) {
        const size_t nl = buf_.find("\r\n");
        if (nl == std::string::npos) return true;
        std::string size_line = buf_.substr(0, nl);
        buf_.erase(0, nl + 2);
        if (size_line.empty()) continue;  // the CRLF after a chunk
        size_line = size_line.substr(0, size_line.find(';'));
        uint64_t size = 0;
        if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(size_line), &size)) return false;
        if (size == 0) {
          done_ = true;
          return true;
        }
        remaining_ = size;
      }
      const size_t take = std::min<uint64_t>(remaining_, buf_.size());
      if (take == 0) return true;
      out.append(buf_, 0, take);
      buf_.erase(0, take);
      remaining_ -= take;
    }
  }
  bool done() const { return done_; }

 private:
  std::string buf_;
  uint64_t remaining_ = 0;
  bool done_ = false;
};

class OpenAiHttpBackend : public Backend {
 public:
  OpenAiHttpBackend(std::string host, std::string port, std::string path, std::string model)
      : host_(std::move(host)),
        port_(std::move(port)),
        path_(std::move(path)),
        model_(std::move(model)) {}

  absl::StatusOr<ServerInfo> Probe(absl::Time deadline) override {
    Connection c;
    if (absl::Status s = c.Connect(host_, port_, deadline); !s.ok()) return s;
    ServerInfo info;
    info.model = model_;
    return info;
  }

  RequestRecord Send(const BenchRequest& request, absl::Time deadline) override {
    RequestRecord r;
    r.prompt_tokens = request.expected_prompt_tokens;
    std::string prompt = request.prompt_ids.empty() ? json::Quote(request.prompt_text)
                                                    : json::IntArray(request.prompt_ids);
    const std::string body =
        absl::StrCat("{\"model\":", json::Quote(model_), ",\"prompt\":", prompt,
                     ",\"max_tokens\":", request.max_tokens, ",\"temperature\":0,\"stream\":true,",
                     "\"ignore_eos\":", request.ignore_eos ? "true" : "false",
                     ",\"stream_options\":{\"include_usage\":true}}");
    const std::string head = absl::StrCat(
        "POST ", path_, " HTTP/1.1\r\nHost: ", host_, ":", port_,
        "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: ",
        body.size(), "\r\nConnection: close\r\n\r\n");
    const absl::Time t0 = absl::Now();
    auto fail = [&](std::string code, std::string msg) {
      r.e2e_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
      r.error_code = std::move(code);
      r.error_message = std::move(msg);
      return r;
    };
    Connection c;
    if (absl::Status s = c.Connect(host_, port_, deadline); !s.ok()) {
      return fail("CONNECT", std::string(s.message()));
    }
    if (absl::Status s = c.WriteAll(head + body); !s.ok()) return fail("SEND", "send failed");

    std::string raw, body_bytes;
    bool headers_done = false, chunked = false, done = false;
    Dechunker dechunk;
    SseParser sse;
    int64_t usage_tokens = -1;
    double last_ms = 0;
    size_t total = 0;
    while (!done) {
      absl::StatusOr<std::string> got = c.Read();
      if (!got.ok()) {
        return fail(got.status().code() == absl::StatusCode::kDeadlineExceeded ? "DEADLINE_EXCEEDED"
                                                                               : "RECV",
                    std::string(got.status().message()));
      }
      if (got->empty()) break;  // EOF
      total += got->size();
      if (total > kMaxResponseBytes) return fail("TOO_LARGE", "response over 64 MiB");
      std::string fresh;
      if (!headers_done) {
        raw += *got;
        const size_t end = raw.find("\r\n\r\n");
        if (end == std::string::npos) continue;
        const std::string headers = absl::AsciiStrToLower(raw.substr(0, end));
        int status = 0;
        std::vector<std::string> first =
            absl::StrSplit(headers.substr(0, headers.find("\r\n")), absl::MaxSplits(' ', 2));
        if (first.size() < 2 || !absl::SimpleAtoi(first[1], &status)) {
          return fail("HTTP_MALFORMED", "bad status line");
        }
        if (status != 200) return fail(absl::StrCat("HTTP_", status), raw.substr(end + 4, 200));
        chunked = headers.find("transfer-encoding: chunked") != std::string::npos;
        headers_done = true;
        fresh = raw.substr(end + 4);
      } else {
        fresh = std::move(*got);
      }
      std::string decoded;
      if (chunked) {
        if (!dechunk.Feed(fresh, decoded)) return fail("HTTP_MALFORMED", "bad chunked framing");
      } else {
        decoded = std::move(fresh);
      }
      for (const std::string& data : sse.Feed(decoded)) {
        if (data == "[DONE]") {
          done = true;
          break;
        }
        absl::StatusOr<json::Value> v = json::Parse(data);
        if (!v.ok() || !v->is_object()) return fail("SSE_MALFORMED", data.substr(0, 200));
        if (const json::Value* u = v->Find("usage"); u != nullptr && u->is_object()) {
          if (const json::Value* n = u->Find("completion_tokens"); n != nullptr) {
            usage_tokens = static_cast<int64_t>(n->number);
          }
          if (const json::Value* n = u->Find("prompt_tokens"); n != nullptr) {
            r.prompt_tokens = static_cast<int64_t>(n->number);
          }
        }
        const json::Value* choices = v->Find("choices");
        if (choices == nullptr || choices->array.empty()) continue;
        const json::Value& ch = choices->array[0];
        if (const json::Value* fr = ch.Find("finish_reason");
            fr != nullptr && fr->kind == json::Value::Kind::kString) {
          r.finish_reason = fr->string;
        }
        const json::Value* text = ch.Find("text");
        if (text == nullptr || text->string.empty()) continue;
        const double now_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
        if (r.num_chunks == 0) {
          r.ttft_ms = now_ms;
        } else {
          r.itl_ms.push_back(now_ms - last_ms);
        }
        last_ms = now_ms;
        ++r.num_chunks;
      }
      if (chunked && dechunk.done()) break;
    }
    r.e2e_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
    r.output_tokens = usage_tokens >= 0 ? usage_tokens : r.num_chunks;
    if (r.num_chunks == 0) return fail("NO_TOKENS", "stream ended without text");
    r.ok = true;
    r.error_code = "OK";
    return r;
  }

 private:
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
  return std::make_unique<OpenAiHttpBackend>(host, port, path, model);
}

}  // namespace tandem::cli::bench
