// Raw HTTP/1.1 over loopback sockets for the HTTP server's edge tests: what a
// library client would hide (many header lines, a request sent slowly or not
// at all, a client that never reads, the connection's close).
#ifndef TANDEM_TESTS_UTIL_RAW_HTTP_H_
#define TANDEM_TESTS_UTIL_RAW_HTTP_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem::testing {

// A connected socket to 127.0.0.1:port (-1 on failure). `rcvbuf` > 0 sets
// SO_RCVBUF before connecting (a small window: a client slow to read).
int ConnectLocal(int port, int rcvbuf = 0);

// Writes all of `data`; false on an error (e.g. the server closed).
bool SendAll(int fd, std::string_view data);

// Reads into `*got` until `done(*got)`, the peer closes or `timeout` passes.
// Returns true when the peer closed (EOF or reset).
template <typename Done>
bool ReadUntil(int fd, std::string* got, Done done, absl::Duration timeout);
bool ReadSome(int fd, std::string* got, absl::Duration timeout, bool* closed);

// True once the peer has closed the connection (EOF or reset) within
// `timeout`; what it sent meanwhile is dropped.
bool WaitClosed(int fd, absl::Duration timeout);

struct RawResponse {
  int status = 0;
  std::string head;  // the status line and fields
  std::string body;  // de-chunked
  // The value of header `name` (case-insensitive), "" when absent.
  std::string Header(const std::string& name) const;
};

// One whole response: Content-Length, chunked, or up to the close.
// nullopt when the connection ends or `timeout` passes before it is whole.
std::optional<RawResponse> ReadResponse(int fd, absl::Duration timeout = absl::Seconds(30));

// A request: `method` `target` with `body` (Content-Length), `extra` header
// lines ("Name: value\r\n" each).
std::string RawRequest(const std::string& method, const std::string& target,
                       const std::string& body, const std::string& extra = "");

template <typename Done>
bool ReadUntil(int fd, std::string* got, Done done, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (!done(*got)) {
    bool closed = false;
    if (!ReadSome(fd, got, end - absl::Now(), &closed)) return closed;
  }
  return false;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UTIL_RAW_HTTP_H_
