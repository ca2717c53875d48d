#include "tests/util/raw_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::testing {

int ConnectLocal(int port, int rcvbuf) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool ReadSome(int fd, std::string* got, absl::Duration timeout, bool* closed) {
  *closed = false;
  pollfd p{fd, POLLIN, 0};
  const int ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout)));
  if (poll(&p, 1, ms) <= 0) return false;
  char buf[16384];
  const ssize_t n = recv(fd, buf, sizeof(buf), 0);
  if (n <= 0) {
    *closed = true;
    return false;
  }
  got->append(buf, static_cast<size_t>(n));
  return true;
}

bool WaitClosed(int fd, absl::Duration timeout) {
  std::string drop;
  return ReadUntil(
      fd, &drop,
      [&drop](const std::string&) {
        drop.clear();
        return false;
      },
      timeout);
}

std::string RawResponse::Header(const std::string& name) const {
  const std::string want = absl::AsciiStrToLower(absl::StrCat("\r\n", name, ":"));
  const std::string lower = absl::AsciiStrToLower(head);
  const size_t pos = lower.find(want);
  if (pos == std::string::npos) return "";
  const size_t start = pos + want.size();
  const size_t end = head.find("\r\n", start);
  return std::string(absl::StripAsciiWhitespace(head.substr(start, end - start)));
}

namespace {

// The de-chunked body once `raw` holds the whole chunked body.
std::optional<std::string> Dechunk(std::string_view raw) {
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t eol = raw.find("\r\n", pos);
    if (eol == std::string_view::npos) return std::nullopt;
    const size_t size = std::strtoul(std::string(raw.substr(pos, eol - pos)).c_str(), nullptr, 16);
    if (size == 0) {
      if (raw.find("\r\n", eol + 2) == std::string_view::npos) return std::nullopt;
      return out;
    }
    if (raw.size() < eol + 2 + size + 2) return std::nullopt;
    out.append(raw.substr(eol + 2, size));
    pos = eol + 2 + size + 2;
  }
}

}  // namespace

std::optional<RawResponse> ReadResponse(int fd, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  std::string got;
  bool closed = ReadUntil(
      fd, &got, [](const std::string& g) { return g.find("\r\n\r\n") != std::string::npos; },
      timeout);
  const size_t head_end = got.find("\r\n\r\n");
  if (head_end == std::string::npos) return std::nullopt;
  RawResponse r;
  r.head = got.substr(0, head_end);
  if (!absl::SimpleAtoi(r.head.substr(9, 3), &r.status)) return std::nullopt;
  std::string raw = got.substr(head_end + 4);
  const bool chunked = absl::EqualsIgnoreCase(r.Header("Transfer-Encoding"), "chunked");
  size_t length = 0;
  const bool has_length = absl::SimpleAtoi(r.Header("Content-Length"), &length);
  auto whole = [&](const std::string& b) {
    if (chunked) return Dechunk(b).has_value();
    return has_length && b.size() >= length;
  };
  if (!closed) closed = ReadUntil(fd, &raw, whole, end - absl::Now());
  if (chunked) {
    std::optional<std::string> body = Dechunk(raw);
    if (!body.has_value()) return std::nullopt;
    r.body = std::move(body).value();
  } else if (has_length) {
    if (raw.size() < length) return std::nullopt;
    r.body = raw.substr(0, length);
  } else {
    if (!closed) return std::nullopt;
    r.body = std::move(raw);
  }
  return r;
}

std::string RawRequest(const std::string& method, const std::string& target,
                       const std::string& body, const std::string& extra) {
  return absl::StrCat(method, " ", target, " HTTP/1.1\r\nHost: 127.0.0.1\r\n", extra,
                      "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n",
                      body);
}

}  // namespace tandem::testing
