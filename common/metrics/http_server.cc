#include "common/metrics/http_server.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "httplib.h"

namespace tandem::metrics {
namespace {

constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";
constexpr const char* kTextContentType = "text/plain; charset=utf-8";

// cpp-httplib's ThreadPool with a bound: at most `max_pending` connections
// are queued or being served; past that the accepting thread serves the new
// one itself, so it stops accepting meanwhile and the kernel's backlog takes
// the rest.
class BoundedTaskQueue final : public httplib::TaskQueue {
 public:
  BoundedTaskQueue(size_t num_threads, size_t max_pending)
      : pool_(num_threads), max_pending_(max_pending) {}

  void enqueue(std::function<void()> fn) override {
    if (pending_.fetch_add(1) >= max_pending_) {
      fn();
      pending_.fetch_sub(1);
      return;
    }
    pool_.enqueue([this, fn = std::move(fn)] {
      fn();
      pending_.fetch_sub(1);
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  httplib::ThreadPool pool_;
  const size_t max_pending_;
  std::atomic<size_t> pending_{0};
};

}  // namespace

MetricsHttpServer::MetricsHttpServer(const MetricsRegistry* registry, Options options)
    : registry_(registry), options_(std::move(options)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Install() {
  httplib::Server& svr = *server_;
  const size_t threads = static_cast<size_t>(options_.num_threads);
  const size_t pending = threads + static_cast<size_t>(options_.max_queued);
  svr.new_task_queue = [threads, pending] { return new BoundedTaskQueue(threads, pending); };
  const auto timeout =
      std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.request_timeout));
  svr.set_read_timeout(timeout);
  svr.set_write_timeout(timeout);
  // The wait for a request's first byte (whole seconds in cpp-httplib).
  svr.set_keep_alive_timeout(static_cast<time_t>(
      std::max(1.0, std::ceil(absl::ToDoubleSeconds(options_.request_timeout)))));
  svr.set_keep_alive_max_count(1);  // one request per connection
  svr.set_payload_max_length(options_.max_body_bytes);
  // cpp-httplib's default adds SO_REUSEPORT, which would let a second server
  // share a taken port; a taken port must be an error.
  svr.set_socket_options([](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });

  const MetricsRegistry* registry = registry_;
  std::function<void()> before_scrape = options_.before_scrape;
  svr.Get("/metrics", [registry, before_scrape](const httplib::Request&, httplib::Response& res) {
    if (before_scrape) before_scrape();
    res.set_content(registry->Serialize(), kMetricsContentType);
  });
  std::function<bool()> healthy = options_.healthy;
  svr.Get("/healthz", [healthy](const httplib::Request&, httplib::Response& res) {
    const bool ok = !healthy || healthy();
    res.status = ok ? 200 : 503;
    res.set_content(ok ? "ok" : "unhealthy", kTextContentType);
  });
  // GET covers HEAD; every other method on the two paths is 405.
  const httplib::Server::Handler not_allowed = [](const httplib::Request&, httplib::Response& res) {
    res.status = 405;
    res.set_header("Allow", "GET, HEAD");
    res.set_content("method not allowed\n", kTextContentType);
  };
  for (const char* path : {"/metrics", "/healthz"}) {
    svr.Post(path, not_allowed);
    svr.Put(path, not_allowed);
    svr.Patch(path, not_allowed);
    svr.Delete(path, not_allowed);
    svr.Options(path, not_allowed);
  }
  // What cpp-httplib answers itself: 404 (no route), 400 (unreadable), 413.
  svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    res.set_content(res.status == 404 ? "not found\n" : "bad request\n", kTextContentType);
  });
}

absl::Status MetricsHttpServer::Start() {
  absl::MutexLock lock(&mu_);
  if (started_) return absl::FailedPreconditionError("metrics server already started");
  started_ = true;
  if (options_.port < 0 || options_.port > 65535) {
    return absl::InvalidArgumentError("metrics server: invalid port " +
                                      std::to_string(options_.port));
  }
  if (options_.num_threads < 1 || options_.max_queued < 0 ||
      options_.request_timeout < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        "metrics server: num_threads must be >= 1, max_queued >= 0, request_timeout >= 1 ms");
  }
  server_ = std::make_unique<httplib::Server>();
  Install();
  const int port = options_.port == 0 ? server_->bind_to_any_port(options_.host)
                   : server_->bind_to_port(options_.host, options_.port) ? options_.port
                                                                         : -1;
  if (port <= 0) {
    server_.reset();
    return absl::UnavailableError("metrics server: cannot listen on " + options_.host + ":" +
                                  std::to_string(options_.port));
  }
  port_.store(port, std::memory_order_release);
  httplib::Server* server = server_.get();
  thread_ = StartListening(server);
  return absl::OkStatus();
}

std::thread StartListening(httplib::Server* server) {
  auto returned = std::make_shared<std::atomic<bool>>(false);
  std::thread t([server, returned] {
    server->listen_after_bind();
    returned->store(true);
  });
  while (!server->is_running() && !returned->load()) absl::SleepFor(absl::Milliseconds(1));
  return t;
}

void MetricsHttpServer::Stop() {
  absl::MutexLock lock(&mu_);
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tandem::metrics
