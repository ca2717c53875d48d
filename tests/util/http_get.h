// A tiny HTTP/1.0 GET client over loopback for tests that read /metrics or
// the Prometheus API (no curl dependency).
#ifndef TANDEM_TESTS_UTIL_HTTP_GET_H_
#define TANDEM_TESTS_UTIL_HTTP_GET_H_

#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "tests/util/raw_http.h"

namespace tandem::testing {

// The response body of GET http://127.0.0.1:port<path_and_query>, or "" when
// the connection fails or the response has no header/body separator. Reads
// time out after 5 s.
inline std::string HttpGetBody(int port, const std::string& path_and_query) {
  const int fd = ConnectLocal(port);
  if (fd < 0) return "";
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string req = "GET " + path_and_query + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[8192];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UTIL_HTTP_GET_H_
