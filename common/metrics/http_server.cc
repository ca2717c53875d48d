#include "common/metrics/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <exception>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "civetweb.h"

namespace tandem::metrics {
namespace {

constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";
constexpr const char* kTextContentType = "text/plain; charset=utf-8";

// Sends a complete response; HEAD gets the headers only. Returns the status
// (civetweb: non-zero = handled).
int Send(mg_connection* conn, int status, const char* content_type, std::string_view body,
         bool head, const char* allow = nullptr) {
  mg_response_header_start(conn, status);
  mg_response_header_add(conn, "Content-Type", content_type, -1);
  mg_response_header_add(conn, "Content-Length", std::to_string(body.size()).c_str(), -1);
  if (allow != nullptr) mg_response_header_add(conn, "Allow", allow, -1);
  mg_response_header_send(conn);
  if (!head && !body.empty()) mg_write(conn, body.data(), body.size());
  return status;
}

// host -> numeric address for civetweb's listening_ports ("[v6]:port" for
// IPv6). civetweb takes numeric addresses only.
absl::Status ListeningPort(const std::string& host, int port, std::string* out,
                           std::string* wake_host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0 || res == nullptr) {
    return absl::InvalidArgumentError("metrics server: cannot resolve host \"" + host +
                                      "\": " + gai_strerror(rc));
  }
  char buf[INET6_ADDRSTRLEN] = {};
  const bool v6 = res->ai_family == AF_INET6;
  const void* addr =
      v6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(res->ai_addr)->sin6_addr)
         : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr);
  const bool ok = inet_ntop(res->ai_family, addr, buf, sizeof(buf)) != nullptr;
  freeaddrinfo(res);
  if (!ok) return absl::InvalidArgumentError("metrics server: bad host \"" + host + "\"");
  *out = v6 ? absl::StrCat("[", buf, "]:", port) : absl::StrCat(buf, ":", port);
  // A wildcard address is reached over loopback.
  *wake_host = std::string_view(buf) == "0.0.0.0" ? "127.0.0.1"
               : std::string_view(buf) == "::"    ? "::1"
                                                  : buf;
  return absl::OkStatus();
}

// Connects to host:port (numeric) and closes at once; errors are ignored.
void WakeListener(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return;
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    (void)connect(fd, res->ai_addr, res->ai_addrlen);
    close(fd);
  }
  freeaddrinfo(res);
}

}  // namespace

MetricsHttpServer::MetricsHttpServer(const MetricsRegistry* registry, Options options)
    : registry_(registry), options_(std::move(options)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

int MetricsHttpServer::HandleRequest(mg_connection* conn, void* cbdata) {
  const auto* self = static_cast<const MetricsHttpServer*>(cbdata);
  const mg_request_info* ri = mg_get_request_info(conn);
  const std::string_view method = ri->request_method != nullptr ? ri->request_method : "";
  const std::string_view path = ri->local_uri != nullptr ? ri->local_uri : "";
  const bool head = method == "HEAD";
  if (path != "/metrics" && path != "/healthz") {
    return Send(conn, 404, kTextContentType, "not found\n", head);
  }
  if (method != "GET" && !head) {
    return Send(conn, 405, kTextContentType, "method not allowed\n", false, "GET, HEAD");
  }
  // No exception may unwind into civetweb's C frames.
  try {
    if (path == "/metrics") {
      return Send(conn, 200, kMetricsContentType, self->registry_->Serialize(), head);
    }
    const bool healthy = !self->options_.healthy || self->options_.healthy();
    return healthy ? Send(conn, 200, kTextContentType, "ok", head)
                   : Send(conn, 503, kTextContentType, "unhealthy", head);
  } catch (const std::exception& e) {
    return Send(conn, 500, kTextContentType, "internal error\n", head);
  }
}

absl::Status MetricsHttpServer::Start() {
  absl::MutexLock lock(&mu_);
  if (started_) return absl::FailedPreconditionError("metrics server already started");
  started_ = true;
  if (options_.port < 0 || options_.port > 65535) {
    return absl::InvalidArgumentError("metrics server: invalid port " +
                                      std::to_string(options_.port));
  }
  if (options_.max_request_bytes < 1024 || options_.num_threads < 1 ||
      options_.request_timeout < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        "metrics server: max_request_bytes must be >= 1024, num_threads >= 1, "
        "request_timeout >= 1 ms");
  }
  std::string listening;
  if (absl::Status s = ListeningPort(options_.host, options_.port, &listening, &wake_address_);
      !s.ok()) {
    return s;
  }
  const std::string threads = std::to_string(options_.num_threads);
  const std::string timeout_ms =
      std::to_string(absl::ToInt64Milliseconds(options_.request_timeout));
  const std::string max_request = std::to_string(options_.max_request_bytes);
  const char* config[] = {"listening_ports",    listening.c_str(),  "num_threads",
                          threads.c_str(),      "request_timeout_ms", timeout_ms.c_str(),
                          "max_request_size",   max_request.c_str(), "enable_keep_alive",
                          "no",                 nullptr};
  mg_callbacks callbacks{};
  mg_init_data init{&callbacks, this, config};
  char error_text[256] = {};
  unsigned error_code = 0;
  mg_error_data error{&error_code, error_text, sizeof(error_text)};
  ctx_ = mg_start2(&init, &error);
  if (ctx_ == nullptr) {
    return absl::UnavailableError("metrics server: cannot listen on " + listening + ": " +
                                  error_text);
  }
  mg_set_request_handler(ctx_, "/", &MetricsHttpServer::HandleRequest, this);
  mg_server_port ports[1] = {};
  if (mg_get_server_ports(ctx_, 1, ports) < 1) {
    mg_stop(ctx_);
    ctx_ = nullptr;
    return absl::UnavailableError("metrics server: no listening port on " + listening);
  }
  port_.store(ports[0].port, std::memory_order_release);
  return absl::OkStatus();
}

void MetricsHttpServer::Stop() {
  absl::MutexLock lock(&mu_);
  if (ctx_ == nullptr) return;
  // civetweb's master thread polls the listening socket in 2 s quanta and
  // sees the stop flag only in between; a connection wakes it at once.
  std::atomic<bool> stopped{false};
  std::thread waker([this, &stopped] {
    while (!stopped.load()) {
      WakeListener(wake_address_, port());
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  mg_stop(ctx_);
  stopped = true;
  waker.join();
  ctx_ = nullptr;
}

}  // namespace tandem::metrics
