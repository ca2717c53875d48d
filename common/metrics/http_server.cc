#include "common/metrics/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics/text_format.h"

namespace tandem::metrics {
namespace {

constexpr std::string_view kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";
constexpr std::string_view kTextContentType = "text/plain; charset=utf-8";
// After answering, read (and drop) what the client still sends for this long,
// so that closing with unread input does not reset the connection before the
// client has read the answer (a 431 is sent with headers still arriving).
constexpr absl::Duration kLingerTime = absl::Milliseconds(500);
constexpr size_t kMaxLingerBytes = 256 * 1024;

enum class WaitResult { kReady, kTimeout, kStop, kError };

// Waits until `fd` has `events`, the deadline passes, or Stop() is called.
WaitResult WaitFor(int fd, short events, absl::Time deadline, int stop_fd) {
  while (true) {
    int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return WaitResult::kTimeout;
    pollfd fds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    int n = poll(fds, 2, static_cast<int>(std::min<int64_t>(ms, 1000)));
    if (n < 0) {
      if (errno == EINTR) continue;
      return WaitResult::kError;
    }
    if (fds[1].revents != 0) return WaitResult::kStop;
    // POLLHUP/POLLERR: let the next recv/send report what happened.
    if (fds[0].revents != 0) return WaitResult::kReady;
  }
}

bool IsTokenChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

struct RequestLine {
  std::string_view method, target, version;
};

// METHOD SP request-target SP HTTP-version, origin-form target, HTTP/1.x.
bool ParseRequestLine(std::string_view line, RequestLine* rl) {
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return false;
  }
  rl->method = line.substr(0, sp1);
  rl->target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  rl->version = line.substr(sp2 + 1);
  bool ok = !rl->method.empty() && !rl->target.empty() && rl->target[0] == '/' &&
            (rl->version == "HTTP/1.1" || rl->version == "HTTP/1.0");
  for (char c : rl->method) ok = ok && IsTokenChar(c);
  for (char c : rl->target) ok = ok && c > 0x20 && c < 0x7f;
  return ok;
}

std::string_view ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

MetricsHttpServer::Response TextResponse(int status, std::string body) {
  return {status, std::string(kTextContentType), std::move(body), false};
}

// Sends all of `data` before the deadline; false on error, timeout or stop.
bool SendAll(int fd, std::string_view data, absl::Time deadline, int stop_fd) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (WaitFor(fd, POLLOUT, deadline, stop_fd) != WaitResult::kReady) return false;
      continue;
    }
    return false;
  }
  return true;
}

// Reads until EOF, the linger time, or kMaxLingerBytes; drops the bytes.
void Linger(int fd, int stop_fd) {
  absl::Time deadline = absl::Now() + kLingerTime;
  size_t total = 0;
  char buf[4096];
  while (total < kMaxLingerBytes) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return;
    if (n > 0) {
      total += n;
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return;
    if (WaitFor(fd, POLLIN, deadline, stop_fd) != WaitResult::kReady) return;
  }
}

}  // namespace

std::string FormatHttpResponse(const MetricsHttpServer::Response& r) {
  std::string out = absl::StrCat("HTTP/1.1 ", r.status, " ", Sv(ReasonPhrase(r.status)),
                                 "\r\nContent-Type: ", r.content_type,
                                 "\r\nContent-Length: ", r.body.size(), "\r\n");
  if (r.status == 405) out.append("Allow: GET, HEAD\r\n");
  out.append("Cache-Control: no-store\r\nConnection: close\r\n\r\n");
  if (!r.head) out.append(r.body);
  return out;
}

MetricsHttpServer::MetricsHttpServer(const MetricsRegistry* registry, Options options)
    : registry_(registry), options_(std::move(options)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

MetricsHttpServer::Response MetricsHttpServer::Handle(std::string_view request) const {
  size_t eol = request.find("\r\n");
  RequestLine rl;
  if (eol == std::string_view::npos || !ParseRequestLine(request.substr(0, eol), &rl)) {
    return TextResponse(400, "bad request\n");
  }
  const std::string_view method = rl.method, target = rl.target;
  // Header lines must look like "name: value" (contents are not needed).
  std::string_view headers = request.substr(eol + 2);
  while (!headers.empty()) {
    size_t end = headers.find("\r\n");
    if (end == std::string_view::npos) return TextResponse(400, "bad request\n");
    std::string_view h = headers.substr(0, end);
    headers.remove_prefix(end + 2);
    if (h.empty()) break;  // the blank line
    size_t colon = h.find(':');
    if (colon == 0 || colon == std::string_view::npos) return TextResponse(400, "bad request\n");
    for (char c : h.substr(0, colon)) {
      if (!IsTokenChar(c)) return TextResponse(400, "bad request\n");
    }
  }
  bool head = method == "HEAD";
  if (method != "GET" && !head) return TextResponse(405, "method not allowed\n");
  std::string_view path = target.substr(0, target.find('?'));
  Response r;
  if (path == "/metrics") {
    r = {200, std::string(kMetricsContentType), registry_->Serialize(), false};
  } else if (path == "/healthz") {
    bool healthy = !options_.healthy || options_.healthy();
    r = healthy ? TextResponse(200, "ok") : TextResponse(503, "unhealthy");
  } else {
    r = TextResponse(404, "not found\n");
  }
  r.head = head;
  return r;
}

void MetricsHttpServer::ServeConnection(Connection* conn) const {
  const int fd = conn->fd;
  const int stop_fd = stop_pipe_[0];
  absl::Time deadline = absl::Now() + options_.read_timeout;
  std::string buf;
  Response response;
  bool respond = false;
  char chunk[4096];
  bool line_checked = false;
  size_t scanned = 0;  // bytes of buf already searched for the terminator
  while (true) {
    // Answer garbage as soon as its first line is complete.
    if (!line_checked && buf.find("\r\n") != std::string::npos) {
      line_checked = true;
      RequestLine rl;
      if (!ParseRequestLine(std::string_view(buf).substr(0, buf.find("\r\n")), &rl)) {
        response = TextResponse(400, "bad request\n");
        respond = true;
        break;
      }
    }
    // A terminator not seen before must end in the newly read bytes.
    size_t end = buf.find("\r\n\r\n", scanned > 3 ? scanned - 3 : 0);
    scanned = buf.size();
    if (end != std::string::npos) {
      response = Handle(std::string_view(buf).substr(0, end + 4));
      respond = true;
      break;
    }
    if (buf.size() >= options_.max_header_bytes) {
      response = TextResponse(431, "request header fields too large\n");
      respond = true;
      break;
    }
    size_t want = std::min(sizeof(chunk), options_.max_header_bytes - buf.size());
    ssize_t n = recv(fd, chunk, want, 0);
    if (n > 0) {
      buf.append(chunk, n);
      continue;
    }
    if (n == 0) {  // client closed its side mid-request: it may still read
      if (!buf.empty()) {
        response = TextResponse(400, "bad request\n");
        respond = true;
      }
      break;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) break;
    // Timeout (slowloris), stop or error: close without answering.
    if (WaitFor(fd, POLLIN, deadline, stop_fd) != WaitResult::kReady) break;
  }
  if (respond) {
    std::string out = FormatHttpResponse(response);
    if (SendAll(fd, out, absl::Now() + options_.write_timeout, stop_fd)) {
      shutdown(fd, SHUT_WR);
      Linger(fd, stop_fd);
    }
  }
  close(fd);
}

absl::Status MetricsHttpServer::Start() {
  {
    absl::MutexLock lock(&mu_);
    if (started_ || stopped_) return absl::FailedPreconditionError("server already started");
    started_ = true;
  }
  if (options_.port < 0 || options_.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("invalid port ", options_.port));
  }
  if (options_.max_header_bytes < 64 || options_.max_connections < 1) {
    return absl::InvalidArgumentError("max_header_bytes must be >= 64, max_connections >= 1");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addrs = nullptr;
  std::string port_str = std::to_string(options_.port);
  int rc = getaddrinfo(options_.host.empty() ? nullptr : options_.host.c_str(), port_str.c_str(),
                       &hints, &addrs);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve \"", options_.host, "\": ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (addrinfo* a = addrs; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      last_error = std::strerror(errno);
      close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  freeaddrinfo(addrs);
  if (listen_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.host, ":", options_.port, ": ", last_error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  int bound_port = options_.port;
  if (getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
    bound_port = bound.ss_family == AF_INET6
                     ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                     : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  if (pipe2(stop_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(listen_fd_);
    listen_fd_ = -1;
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  port_.store(bound_port, std::memory_order_release);
  absl::MutexLock lock(&mu_);
  acceptor_ = std::thread([this] { AcceptLoop(); });
  return absl::OkStatus();
}

void MetricsHttpServer::AcceptLoop() {
  while (true) {
    ReapConnections(/*all=*/false);
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents != 0) break;
    if ((fds[0].revents & POLLIN) == 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // Out of descriptors: back off instead of spinning on a ready socket.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        pollfd stop = {stop_pipe_[0], POLLIN, 0};
        poll(&stop, 1, 50);
      }
      continue;
    }
    int active = 0;
    for (const auto& c : connections_) active += c->done.load(std::memory_order_acquire) ? 0 : 1;
    if (active >= options_.max_connections) {
      std::string busy = FormatHttpResponse(TextResponse(503, "too many connections\n"));
      (void)send(fd, busy.data(), busy.size(), MSG_NOSIGNAL);  // best effort, never blocks
      close(fd);
      continue;
    }
    auto conn = std::make_unique<Connection>();
    conn->fd = fd;
    Connection* c = conn.get();
    c->thread = std::thread([this, c] {
      ServeConnection(c);
      c->done.store(true, std::memory_order_release);
    });
    connections_.push_back(std::move(conn));
  }
  ReapConnections(/*all=*/true);
}

void MetricsHttpServer::ReapConnections(bool all) {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (all || (*it)->done.load(std::memory_order_acquire)) {
      (*it)->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void MetricsHttpServer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    bool running = started_ && !stopped_;
    stopped_ = true;
    if (!running || !acceptor_.joinable()) return;
  }
  char byte = 1;
  // The pipe stays readable from now on: every poll() sees the stop.
  while (write(stop_pipe_[1], &byte, 1) < 0 && errno == EINTR) {
  }
  acceptor_.join();
  close(listen_fd_);
  close(stop_pipe_[0]);
  close(stop_pipe_[1]);
  listen_fd_ = stop_pipe_[0] = stop_pipe_[1] = -1;
}

}  // namespace tandem::metrics
