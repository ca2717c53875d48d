// Test helper: a `tandem serve` cluster as real processes on loopback.
// Start() picks free ports, runs the binary with --endpoints-file and waits
// for the file (written once every worker is registered and healthy);
// Stop() sends SIGTERM and expects exit code 0.
#ifndef TANDEM_TESTS_INTEGRATION_CLUSTER_UTIL_H_
#define TANDEM_TESTS_INTEGRATION_CLUSTER_UTIL_H_

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/util/http_get.h"
#include "tests/util/json_reader.h"
#include "tests/util/subprocess.h"

namespace tandem::testing {

inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// Forks and execs argv (argv[0] a path) with stdout and stderr going to
// `log_file`; returns the child's pid.
// Everything is prepared before fork: the test's other threads may hold the
// allocator's lock at the fork, so the child makes async-signal-safe calls
// only (an allocation there can hang it forever, as seen under ASan).
inline pid_t SpawnLogged(const std::vector<std::string>& argv, const std::string& log_file) {
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int log = open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const pid_t pid = fork();
  if (pid == 0) {
    if (log >= 0) {
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  if (log >= 0) close(log);
  return pid;
}

// `n` child processes that spin on a CPU until destroyed: CPU contention
// beside a test (engine steps become slow), e.g. to reproduce a test's
// timing assumptions. n = TANDEM_TEST_CPU_HOGS (0..64) by default.
class CpuHogs {
 public:
  CpuHogs() : CpuHogs(FromEnv()) {}
  explicit CpuHogs(int n) {
    for (int i = 0; i < n; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        for (;;) asm volatile("" ::: "memory");  // spin; never optimized away
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~CpuHogs() {
    for (pid_t pid : pids_) kill(pid, SIGKILL);
    for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }
  CpuHogs(const CpuHogs&) = delete;
  CpuHogs& operator=(const CpuHogs&) = delete;
  int size() const { return static_cast<int>(pids_.size()); }

 private:
  static int FromEnv() {
    const char* v = std::getenv("TANDEM_TEST_CPU_HOGS");
    const int n = v != nullptr ? std::atoi(v) : 0;
    return n >= 0 && n <= 64 ? n : 0;
  }
  std::vector<pid_t> pids_;
};

// {"--device", $TANDEM_TEST_DEVICE} when set (tests/gpu/run.sh runs the
// cluster tests with cuda), else nothing: the engines run on the CPU.
inline std::vector<std::string> DeviceArgs() {
  const char* v = std::getenv("TANDEM_TEST_DEVICE");
  if (v == nullptr || *v == '\0') return {};
  return {"--device", v};
}

struct Endpoint {
  std::string role;
  int pid = 0;
  std::string grpc_address;
  std::string metrics_address;
  std::string http_address;  // the router's OpenAI HTTP API ("" when off)
};

// Value of the first sample of `name` with `phase="router"` (and `also` in
// its labels) in the router's /metrics; -1 when absent.
inline double RouterMetric(const Endpoint& router, const std::string& name,
                           const std::string& also = "") {
  const int port = std::stoi(router.metrics_address.substr(router.metrics_address.rfind(':') + 1));
  const std::string body = HttpGetBody(port, "/metrics");
  const std::string prefix = name + "{";  // labels in any order
  for (size_t pos = 0; (pos = body.find(prefix, pos)) != std::string::npos; ++pos) {
    if (pos > 0 && body[pos - 1] != '\n') continue;
    const size_t end = body.find('\n', pos);
    const std::string line = body.substr(pos, end - pos);
    if (line.find("phase=\"router\"") == std::string::npos) continue;
    if (line.find(also) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

class ServeProcess {
 public:
  // Returns "" on success, else what went wrong (with the log).
  std::string Start(std::vector<std::string> extra_args, int timeout_s = 180) {
    char dir_template[] = "/tmp/tandem_cluster_XXXXXX";
    dir_ = mkdtemp(dir_template);
    endpoints_file_ = dir_ + "/endpoints.json";
    log_file_ = dir_ + "/serve.log";
    std::vector<std::string> argv = {TandemBinary(), "serve",
                                     // Every process binds a free port itself and
                                     // the endpoints file reports it: no race
                                     // between picking a port and binding it.
                                     "--port", "0", "--metrics-port", "0", "--endpoints-file",
                                     endpoints_file_, "--kv-cache-memory", "256MiB",
                                     // Never serve's fixed default 8000: tests run in parallel.
                                     "--http-port", "0"};
    // The disaggregated tests test the handoff: every prompt, however
    // short, goes through a prefill worker unless a test sets the
    // pd-decider's threshold itself.
    if (std::find(extra_args.begin(), extra_args.end(), "--remote-prefill-min-tokens") ==
        extra_args.end()) {
      argv.insert(argv.end(), {"--remote-prefill-min-tokens", "0"});
    }
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    for (const std::string& a : DeviceArgs()) argv.push_back(a);
    pid_ = SpawnLogged(argv, log_file_);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < give_up) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return "tandem serve exited early:\n" + Log();
      }
      std::ifstream f(endpoints_file_);
      if (f.good()) {
        std::stringstream ss;
        ss << f.rdbuf();
        Json j = Json::Parse(ss.str());
        for (size_t i = 0; i < j.size(); ++i) {
          endpoints_.push_back({j[i]["role"].str, static_cast<int>(j[i]["pid"].number),
                                j[i]["grpc_address"].str, j[i]["metrics_address"].str,
                                j[i].has("http_address") ? j[i]["http_address"].str : ""});
        }
        return "";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return "tandem serve not ready in time:\n" + Log();
  }

  // SIGTERM; the exit code (0 expected), -1 on a timeout (then SIGKILL).
  int Stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    int status = 0;
    while (std::chrono::steady_clock::now() < give_up) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return -1;
  }
  ~ServeProcess() { Stop(); }

  std::string Log() const {
    std::ifstream f(log_file_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  const std::vector<Endpoint>& endpoints() const { return endpoints_; }
  std::string Address(const std::string& role) const {
    for (const auto& e : endpoints_) {
      if (e.role == role) return e.grpc_address;
    }
    return "";
  }
  const std::string& dir() const { return dir_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  std::string dir_, endpoints_file_, log_file_;
  std::vector<Endpoint> endpoints_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_INTEGRATION_CLUSTER_UTIL_H_
