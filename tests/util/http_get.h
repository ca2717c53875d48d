// A tiny HTTP/1.0 GET client over loopback for tests that read /metrics or
// the Prometheus API (no curl dependency).
#ifndef TANDEM_TESTS_UTIL_HTTP_GET_H_
#define TANDEM_TESTS_UTIL_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace tandem::testing {

// The response body of GET http://127.0.0.1:port<path_and_query>, or "" when
// the connection fails or the response has no header/body separator. Reads
// time out after 5 s.
inline std::string HttpGetBody(int port, const std::string& path_and_query) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
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
