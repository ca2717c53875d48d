// The OpenAI HTTP server's edge, in-process on port 0 with a scripted
// backend (no engine): the header-size bound (431, then still serving), the
// connection bound (503 with Retry-After, then a slot comes back), a client
// too slow to send its request and an idle keep-alive connection are closed,
// a client that stops reading is cut off by the write timeout (its call
// cancelled), a client gone mid-stream is found by the SSE ping and its call
// cancelled, and many open streams cost the server no threads.
#include "services/http/openai_server.h"

#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/gguf/gguf.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/vocab.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/router/generation_service.h"
#include "tests/util/raw_http.h"
#include "tests/util/test_paths.h"
#include "tests/util/wait.h"

namespace tandem::http {
namespace {

using nlohmann::json;
using router::BackendCall;
using router::BackendEvent;
using router::CallQueue;
using testing::ConnectLocal;
using testing::RawRequest;
using testing::ReadResponse;
using testing::SendAll;
using testing::WaitClosed;
using testing::WaitFor;

// Calls run until the test finishes them (Emit) or they are cancelled.
class ScriptedBackend final : public router::Backend {
 public:
  class Call final : public BackendCall {
   public:
    Call(ScriptedBackend* owner, std::shared_ptr<CallQueue> q) : owner_(owner), queue_(q) {}
    ~Call() override { Cancel(); }
    void Cancel() override {
      if (!owner_->Finish(queue_.get())) return;
      BackendEvent e;
      e.finished = true;
      e.finish_reason = tandem::v1::FINISH_REASON_CANCELLED;
      queue_->Push(std::move(e));
      absl::MutexLock lock(&owner_->mu_);
      ++owner_->cancelled_;
    }

   private:
    ScriptedBackend* owner_;
    std::shared_ptr<CallQueue> queue_;
  };

  absl::StatusOr<std::unique_ptr<BackendCall>> Start(const router::PreparedRequest&,
                                                     std::shared_ptr<CallQueue> q) override {
    absl::MutexLock lock(&mu_);
    open_.push_back(q);
    return std::make_unique<Call>(this, std::move(q));
  }
  bool Ready() const override { return true; }

  // Pushes `n` token events of `text` and then a LENGTH finish into every
  // open call.
  void FinishAll(int n, const std::string& text) {
    std::vector<std::shared_ptr<CallQueue>> open;
    {
      absl::MutexLock lock(&mu_);
      open.swap(open_);
    }
    for (auto& q : open) {
      for (int i = 0; i < n; ++i) {
        BackendEvent e;
        e.token_ids = {42};
        e.text = text;
        q->Push(std::move(e));
      }
      BackendEvent e;
      e.finished = true;
      e.finish_reason = tandem::v1::FINISH_REASON_LENGTH;
      q->Push(std::move(e));
    }
  }
  // Pushes one token event of `text` into every open call.
  void EmitAll(const std::string& text) {
    absl::MutexLock lock(&mu_);
    for (auto& q : open_) {
      BackendEvent e;
      e.token_ids = {42};
      e.text = text;
      q->Push(std::move(e));
    }
  }
  int num_open() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(open_.size());
  }
  int num_cancelled() {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

 private:
  // Takes `q` out of the open calls; false when it was not there.
  bool Finish(CallQueue* q) {
    absl::MutexLock lock(&mu_);
    for (auto it = open_.begin(); it != open_.end(); ++it) {
      if (it->get() == q) {
        open_.erase(it);
        return true;
      }
    }
    return false;
  }

  absl::Mutex mu_;
  std::vector<std::shared_ptr<CallQueue>> open_ ABSL_GUARDED_BY(mu_);
  int cancelled_ ABSL_GUARDED_BY(mu_) = 0;
};

int NumThreads() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return 0;
}

const std::string kStreamBody = R"({"prompt": "Hello", "max_tokens": 100, "stream": true})";

class OpenAiServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto file = gguf::GgufFile::Open(testing::DefaultModelPath());
    ASSERT_TRUE(file.ok()) << file.status();
    auto vocab = tokenizer::VocabFromGguf(**file);
    ASSERT_TRUE(vocab.ok()) << vocab.status();
    auto tok = tokenizer::Tokenizer::Create(std::move(vocab).value());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(tok).value().release();
  }
  static void TearDownTestSuite() { delete tokenizer_; }

  // A service on the scripted backend and a server with `o`'s bounds.
  void StartServer(OpenAiServer::Options o) {
    router::GenerationServiceImpl::Options g;
    g.tokenizer = tokenizer_;
    g.limits = {2048, 49152, 2047};
    g.model_name = "test";
    g.max_inflight = 1000;
    g.backend = &backend_;
    generation_ = std::make_unique<router::GenerationServiceImpl>(std::move(g));
    o.host = "127.0.0.1";
    o.port = 0;
    o.generation = generation_.get();
    auto s = OpenAiServer::Start(std::move(o));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(s).value();
    port_ = server_->port();
  }
  void TearDown() override {
    server_.reset();
    EXPECT_EQ(generation_ == nullptr ? 0 : generation_->num_inflight(), 0);
  }
  // GET /health on a new connection: its status (0 = no response).
  int Health() {
    const int fd = ConnectLocal(port_);
    if (fd < 0) return 0;
    SendAll(fd, RawRequest("GET", "/health", ""));
    auto r = ReadResponse(fd);
    close(fd);
    return r.has_value() ? r->status : 0;
  }

  static tokenizer::Tokenizer* tokenizer_;
  ScriptedBackend backend_;
  std::unique_ptr<router::GenerationServiceImpl> generation_;
  std::unique_ptr<OpenAiServer> server_;
  int port_ = 0;
};
tokenizer::Tokenizer* OpenAiServerTest::tokenizer_ = nullptr;

TEST_F(OpenAiServerTest, HeaderOverTheBoundIs431AndTheServerKeepsServing) {
  OpenAiServer::Options o;
  o.max_header_bytes = 16 << 10;
  StartServer(o);
  // Many short lines (each far below any per-line limit), 40 KiB in all.
  std::string many;
  for (int i = 0; i < 2000; ++i) many += absl::StrCat("X-Pad-", i, ": abcdefgh\r\n");
  const int fd = ConnectLocal(port_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, RawRequest("POST", "/v1/completions", kStreamBody, many)));
  auto r = ReadResponse(fd);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 431) << r->head;
  json j = json::parse(r->body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r->body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(WaitClosed(fd, absl::Seconds(10)));
  close(fd);
  EXPECT_EQ(backend_.num_open(), 0);  // never admitted
  // Below the bound: served. And the server goes on.
  std::string some;
  for (int i = 0; i < 100; ++i) some += absl::StrCat("X-Pad-", i, ": abcdefgh\r\n");
  const int fd2 = ConnectLocal(port_);
  ASSERT_TRUE(SendAll(fd2, RawRequest("GET", "/health", "", some)));
  r = ReadResponse(fd2);
  close(fd2);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(Health(), 200);
}

TEST_F(OpenAiServerTest, ConnectionsOverTheBoundGet503ThenASlotComesBack) {
  OpenAiServer::Options o;
  o.max_connections = 4;
  StartServer(o);
  // Four keep-alive connections, each answered once: all open and counted.
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) {
    fds.push_back(ConnectLocal(port_));
    ASSERT_TRUE(SendAll(fds.back(), RawRequest("GET", "/health", "")));
    auto r = ReadResponse(fds.back());
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
  }
  const int extra = ConnectLocal(port_);
  ASSERT_GE(extra, 0);
  ASSERT_TRUE(SendAll(extra, RawRequest("GET", "/health", "")));
  auto r = ReadResponse(extra);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->Header("Retry-After"), "1");
  json j = json::parse(r->body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r->body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find("connections"), std::string::npos);
  EXPECT_TRUE(WaitClosed(extra, absl::Seconds(10)));
  close(extra);
  // The four still work; one closed frees a slot.
  ASSERT_TRUE(SendAll(fds[0], RawRequest("GET", "/health", "")));
  r = ReadResponse(fds[0]);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  close(fds[0]);
  EXPECT_TRUE(WaitFor([&] { return Health() == 200; }, absl::Seconds(10)));
  for (size_t i = 1; i < fds.size(); ++i) close(fds[i]);
}

TEST_F(OpenAiServerTest, SlowSilentAndIdleClientsAreClosed) {
  OpenAiServer::Options o;
  o.read_timeout = absl::Milliseconds(300);
  o.idle_timeout = absl::Milliseconds(300);
  StartServer(o);
  // Slowloris: half a header, then nothing.
  const int slow = ConnectLocal(port_);
  ASSERT_TRUE(SendAll(slow, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n"));
  // Connected, never a byte.
  const int silent = ConnectLocal(port_);
  // One request answered, then idle on keep-alive.
  const int idle = ConnectLocal(port_);
  ASSERT_TRUE(SendAll(idle, RawRequest("GET", "/health", "")));
  auto r = ReadResponse(idle);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(WaitClosed(slow, absl::Seconds(10)));
  EXPECT_TRUE(WaitClosed(silent, absl::Seconds(10)));
  EXPECT_TRUE(WaitClosed(idle, absl::Seconds(10)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  close(slow);
  close(silent);
  close(idle);
  EXPECT_EQ(Health(), 200);
}

// A streaming client that never reads: the server's writes fill the socket
// buffers, the write timeout ends the connection and the call is cancelled.
TEST_F(OpenAiServerTest, ClientThatStopsReadingIsCutOffAndItsCallCancelled) {
  OpenAiServer::Options o;
  o.write_timeout = absl::Milliseconds(500);
  StartServer(o);
  const int fd = ConnectLocal(port_, /*rcvbuf=*/4096);
  ASSERT_TRUE(SendAll(fd, RawRequest("POST", "/v1/completions", kStreamBody)));
  ASSERT_TRUE(WaitFor([&] { return backend_.num_open() == 1; }, absl::Seconds(10)));
  const std::string big(64 << 10, 'x');
  // Far more than the socket buffers hold, until the server gives up.
  EXPECT_TRUE(WaitFor(
      [&] {
        if (backend_.num_cancelled() == 1) return true;
        backend_.EmitAll(big);
        return false;
      },
      absl::Seconds(20)));
  EXPECT_TRUE(WaitFor([&] { return generation_->num_inflight() == 0; }));
  close(fd);
  EXPECT_EQ(Health(), 200);
}

// Idle stream: no token comes, the SSE ping finds the client gone.
TEST_F(OpenAiServerTest, ClientGoneFromAnIdleStreamIsFoundByThePing) {
  OpenAiServer::Options o;
  o.ping_interval = absl::Milliseconds(100);
  StartServer(o);
  const int fd = ConnectLocal(port_);
  ASSERT_TRUE(SendAll(fd, RawRequest("POST", "/v1/completions", kStreamBody)));
  std::string got;
  testing::ReadUntil(
      fd, &got, [](const std::string& g) { return g.find(": ping") != std::string::npos; },
      absl::Seconds(10));
  EXPECT_NE(got.find("text/event-stream"), std::string::npos) << got;
  EXPECT_NE(got.find(": ping"), std::string::npos) << got;
  EXPECT_EQ(generation_->num_inflight(), 1);
  close(fd);
  EXPECT_TRUE(WaitFor([&] { return backend_.num_cancelled() == 1; }, absl::Seconds(10)));
  EXPECT_TRUE(WaitFor([&] { return generation_->num_inflight() == 0; }));
}

// 300 streams open at once, waiting for tokens: the server's threads do not
// grow (a thread per stream would add 300); then every stream completes.
TEST_F(OpenAiServerTest, ManyOpenStreamsCostNoThreads) {
  constexpr int kStreams = 300;
  OpenAiServer::Options o;
  StartServer(o);
  const int threads_before = NumThreads();
  std::vector<int> fds;
  for (int i = 0; i < kStreams; ++i) {
    fds.push_back(ConnectLocal(port_));
    ASSERT_GE(fds.back(), 0);
    ASSERT_TRUE(SendAll(fds.back(), RawRequest("POST", "/v1/completions", kStreamBody)));
  }
  ASSERT_TRUE(WaitFor([&] { return backend_.num_open() == kStreams; }, absl::Seconds(30)));
  EXPECT_EQ(generation_->num_inflight(), kStreams);
  EXPECT_LE(NumThreads(), threads_before + 2);
  backend_.FinishAll(3, "ab");
  for (int fd : fds) {
    auto r = ReadResponse(fd);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->body.find("\"finish_reason\":\"length\""), std::string::npos) << r->body;
    EXPECT_NE(r->body.find("data: [DONE]"), std::string::npos);
    close(fd);
  }
  EXPECT_TRUE(WaitFor([&] { return generation_->num_inflight() == 0; }));
}

// Stop with streams and a non-streaming call open: every call is cancelled
// and has given its slot back when Stop returns (the service may go next).
TEST_F(OpenAiServerTest, StopEndsEveryOpenCall) {
  StartServer({});
  std::vector<int> fds;
  for (int i = 0; i < 8; ++i) {
    fds.push_back(ConnectLocal(port_));
    const std::string body = i == 0 ? R"({"prompt": "Hello", "max_tokens": 100})" : kStreamBody;
    ASSERT_TRUE(SendAll(fds.back(), RawRequest("POST", "/v1/completions", body)));
  }
  ASSERT_TRUE(WaitFor([&] { return backend_.num_open() == 8; }, absl::Seconds(10)));
  server_->Stop();
  EXPECT_EQ(generation_->num_inflight(), 0);
  EXPECT_EQ(backend_.num_cancelled(), 8);
  for (int fd : fds) {
    EXPECT_TRUE(WaitClosed(fd, absl::Seconds(10)));
    close(fd);
  }
}

TEST_F(OpenAiServerTest, UnknownPathAndWrongMethodGetOpenAiErrors) {
  StartServer({});
  const int fd = ConnectLocal(port_);
  // HEAD: GET's header without the body (the next answer on the connection
  // would not parse after a stray body).
  ASSERT_TRUE(SendAll(fd, "HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string head;
  testing::ReadUntil(
      fd, &head, [](const std::string& g) { return g.find("\r\n\r\n") != std::string::npos; },
      absl::Seconds(10));
  EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
  EXPECT_EQ(head.substr(head.find("\r\n\r\n") + 4), "");
  ASSERT_TRUE(SendAll(fd, RawRequest("POST", "/health", "")));
  auto r = ReadResponse(fd);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->Header("Allow"), "GET, HEAD");
  ASSERT_TRUE(SendAll(fd, RawRequest("GET", "/v1/nothing", "")));
  r = ReadResponse(fd);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 404);
  EXPECT_TRUE(json::parse(r->body)["error"]["message"].is_string());
  ASSERT_TRUE(SendAll(fd, RawRequest("GET", "/v1/completions", "")));
  r = ReadResponse(fd);  // the same connection: errors keep it open
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->Header("Allow"), "POST");
  EXPECT_TRUE(json::parse(r->body)["error"]["message"].is_string());
  ASSERT_TRUE(SendAll(fd, "NOT-HTTP\r\n\r\n"));
  r = ReadResponse(fd);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 400);
  close(fd);
  EXPECT_EQ(Health(), 200);
}

}  // namespace
}  // namespace tandem::http
