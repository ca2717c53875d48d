// The OpenAI-compatible HTTP API of a real `tandem serve` (docs/api.md):
// completions and chat, streamed and not, equal to the gRPC API's greedy
// output; a table of malformed bodies, each with its status and OpenAI error
// JSON while the server keeps serving; a streaming client that disconnects
// frees its KV; too many header lines get 431 and the server goes on.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/integration/cluster_util.h"
#include "tests/util/http_get.h"
#include "tests/util/raw_http.h"

namespace tandem::testing {
namespace {

using nlohmann::json;
using testing::ConnectLocal;
using testing::RawRequest;
using testing::ReadResponse;
using testing::SendAll;

int PortOf(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }

// Greedy output through the gRPC API: text and (prompt, completion) tokens.
struct GrpcResult {
  std::string text;
  int prompt_tokens = -1;
  int completion_tokens = -1;
};

GrpcResult GrpcGenerate(const std::string& address, const tandem::v1::GenerateRequest& request) {
  auto stub = tandem::v1::Generation::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, request);
  GrpcResult r;
  tandem::v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    r.text += resp.text();
    if (resp.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
      r.prompt_tokens = resp.usage().prompt_tokens();
      r.completion_tokens = resp.usage().completion_tokens();
    }
  }
  EXPECT_TRUE(reader->Finish().ok());
  return r;
}

// The value of the first sample of `name` in a Prometheus text page, or -1.
double MetricValue(const std::string& page, const std::string& name) {
  size_t pos = 0;
  while ((pos = page.find(name, pos)) != std::string::npos) {
    const bool line_start = pos == 0 || page[pos - 1] == '\n';
    const char next = page[pos + name.size()];
    if (line_start && (next == ' ' || next == '{')) {
      // The value is the line's last field (label values may hold spaces).
      const size_t eol = page.find('\n', pos);
      const std::string line = page.substr(pos, eol - pos);
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
    pos += name.size();
  }
  return -1;
}

// The content of every SSE "data:" event of a body.
std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  return out;
}

class OpenAiHttpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    serve_ = new ServeProcess();
    const std::string err = serve_->Start({"--colocated"});
    ASSERT_EQ(err, "");
    ASSERT_FALSE(serve_->endpoints()[0].http_address.empty()) << serve_->Log();
    http_port_ = PortOf(serve_->endpoints()[0].http_address);
    metrics_port_ = PortOf(serve_->endpoints()[0].metrics_address);
    grpc_address_ = serve_->Address("router");
    httplib::Client c("127.0.0.1", http_port_);
    auto models = c.Get("/v1/models");
    ASSERT_TRUE(models);
    ASSERT_EQ(models->status, 200);
    model_ = json::parse(models->body)["data"][0]["id"].get<std::string>();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(serve_->Stop(), 0);
    delete serve_;
  }
  static httplib::Result Post(const std::string& path, const std::string& body) {
    httplib::Client c("127.0.0.1", http_port_);
    c.set_read_timeout(std::chrono::seconds(120));
    return c.Post(path.c_str(), body, "application/json");
  }

  static ServeProcess* serve_;
  static int http_port_, metrics_port_;
  static std::string grpc_address_, model_;
};
ServeProcess* OpenAiHttpTest::serve_ = nullptr;
int OpenAiHttpTest::http_port_ = 0;
int OpenAiHttpTest::metrics_port_ = 0;
std::string OpenAiHttpTest::grpc_address_;
std::string OpenAiHttpTest::model_;

TEST_F(OpenAiHttpTest, HealthAndModels) {
  httplib::Client c("127.0.0.1", http_port_);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  json j = json::parse(m->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_FALSE(model_.empty());
}

TEST_F(OpenAiHttpTest, CompletionEqualsGrpc) {
  tandem::v1::GenerateRequest g;
  g.set_text("The capital of France is");
  g.mutable_sampling()->set_temperature(0);
  g.mutable_stop()->set_max_tokens(12);
  const GrpcResult want = GrpcGenerate(grpc_address_, g);
  ASSERT_GT(want.completion_tokens, 0);

  json body = {{"model", model_},
               {"prompt", "The capital of France is"},
               {"max_tokens", 12},
               {"temperature", 0}};
  auto r = Post("/v1/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], model_);
  EXPECT_EQ(j["choices"][0]["text"], want.text);
  EXPECT_EQ(j["usage"]["prompt_tokens"], want.prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], want.completion_tokens);
  EXPECT_EQ(j["usage"]["total_tokens"], want.prompt_tokens + want.completion_tokens);

  // Streamed: the deltas add up to the same text; usage chunk; [DONE] last.
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  r = Post("/v1/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  std::vector<std::string> events = SseData(r->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    json c = json::parse(events[i]);
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, want.text);
  EXPECT_EQ(finish, "length");
  json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], want.completion_tokens);

  // A prompt of token ids.
  json ids = {{"prompt", {1, 2, 3}}, {"max_tokens", 3}, {"temperature", 0}};
  r = Post("/v1/completions", ids.dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["prompt_tokens"], 3);
}

TEST_F(OpenAiHttpTest, ChatEqualsGrpc) {
  tandem::v1::GenerateRequest g;
  auto* msg = g.mutable_messages()->add_messages();
  msg->set_role("user");
  msg->set_content("What is 2+2?");
  g.mutable_sampling()->set_temperature(0);
  g.mutable_stop()->set_max_tokens(10);
  const GrpcResult want = GrpcGenerate(grpc_address_, g);
  ASSERT_GT(want.completion_tokens, 0);

  json body = {{"model", model_},
               {"messages", {{{"role", "user"}, {"content", "What is 2+2?"}}}},
               {"max_completion_tokens", 10},
               {"temperature", 0},
               {"logprobs", true},
               {"top_logprobs", 2}};
  auto r = Post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], want.text);
  EXPECT_EQ(j["usage"]["prompt_tokens"], want.prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], want.completion_tokens);
  ASSERT_EQ(j["choices"][0]["logprobs"]["content"].size(),
            static_cast<size_t>(want.completion_tokens));
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 2u);

  body["stream"] = true;
  body.erase("logprobs");
  body.erase("top_logprobs");
  r = Post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  std::vector<std::string> events = SseData(r->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(json::parse(events[0])["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (c["choices"][0]["delta"].contains("content")) {
      text += c["choices"][0]["delta"]["content"].get<std::string>();
    }
  }
  EXPECT_EQ(text, want.text);
}

TEST_F(OpenAiHttpTest, MalformedBodiesGetOpenAiErrors) {
  struct Case {
    std::string path, body;
    int status;
    std::string param;  // "" = not checked
  };
  const std::string c = "/v1/completions", chat = "/v1/chat/completions";
  const std::vector<Case> cases = {
      {c, "{not json", 400, "body"},
      {c, "[1, 2]", 400, "body"},
      {c, std::string(100, '[') + std::string(100, ']'), 400, "body"},
      {c, "{\"prompt\": \"a\xff\xfe\"}", 400, "body"},  // not UTF-8
      {c, "{}", 400, "prompt"},
      {c, R"({"prompt": 5})", 400, "prompt"},
      {c, R"({"prompt": "x", "temperature": "hot"})", 400, "temperature"},
      {c, R"({"prompt": "x", "temperature": -1})", 400, "temperature"},
      {c, R"({"prompt": "x", "top_p": 7})", 400, "top_p"},
      {c, R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens"},
      {c, R"({"prompt": "x", "max_tokens": 99999999})", 400, "max_tokens"},
      {c, R"({"prompt": "x", "max_tokens": 1e30})", 400, "max_tokens"},
      {c, R"({"prompt": "x", "n": 2})", 400, "n"},
      {c, R"({"prompt": "x", "stop": [1]})", 400, "stop"},
      {c, R"({"prompt": "x", "logit_bias": {"abc": 1}})", 400, "logit_bias"},
      {c, R"({"prompt": "x", "frobnicate": 1})", 400, "frobnicate"},
      {c, R"({"prompt": "x", "presence_penalty": 3})", 400, "presence_penalty"},
      {c, R"({"prompt": "x", "logit_bias": {"99999999": 1}})", 400, "logit_bias"},
      {chat,
       R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 99, "logprobs": true})",
       400, "top_logprobs"},
      {c, R"({"prompt": [99999999]})", 400, "prompt"},
      {c, R"({"prompt": "x", "model": "no-such-model"})", 404, "model"},
      {chat, R"({"messages": []})", 400, "messages"},
      {chat, R"({"messages": [{"role": "wizard", "content": "hi"}]})", 400, "messages[0].role"},
      {chat, R"({"messages": [{"role": "user", "content": 3}]})", 400, "messages[0].content"},
      {c, std::string(5 << 20, ' '), 413, ""},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.body.substr(0, 80));
    auto r = Post(k.path, k.body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, k.status) << r->body;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r->body;
    ASSERT_TRUE(j.contains("error"));
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"]["type"].is_string());
    EXPECT_TRUE(j["error"].contains("param"));
    EXPECT_TRUE(j["error"].contains("code"));
    if (!k.param.empty()) {
      EXPECT_EQ(j["error"]["param"], k.param);
    }
    if (k.status == 404) {
      EXPECT_EQ(j["error"]["code"], "model_not_found");
    }
  }
  // Still serving.
  auto r = Post(c, R"({"prompt": "Hello", "max_tokens": 2})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

// Opens a long streaming completion on a raw socket, reads until the first
// token chunk, runs `while_streaming`, then closes the socket.
void StreamThenDisconnect(int http_port, const std::function<void()>& while_streaming,
                          const std::string& extra_headers = "") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(http_port));
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string body = json{
      {"prompt", "Once upon a time"},
      {"max_tokens", 8000},
      {"ignore_eos", true},
      {"stream", true}}.dump();
  const std::string req =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\n" +
      extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string got;
  char buf[4096];
  while (got.find("\"text\"") == std::string::npos) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  while_streaming();
  close(fd);
}

// Polls the router's /metrics until no request is in flight (true) or 30 s pass.
bool WaitRouterIdle(int metrics_port) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < give_up) {
    if (MetricValue(HttpGetBody(metrics_port, "/metrics"), "tandem_num_requests_running") == 0) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST_F(OpenAiHttpTest, DisconnectMidStreamCancels) {
  StreamThenDisconnect(http_port_, [] {
    EXPECT_EQ(MetricValue(HttpGetBody(metrics_port_, "/metrics"), "tandem_num_requests_running"),
              1);
  });
  EXPECT_TRUE(WaitRouterIdle(metrics_port_));
}

// 2,000 short header lines (40 KiB, each line far below any per-line
// limit): 431 with OpenAI's error JSON, nothing admitted, and the server
// keeps serving.
TEST_F(OpenAiHttpTest, ManyHeaderLinesGet431AndTheServerKeepsServing) {
  std::string many;
  for (int i = 0; i < 2000; ++i) many += "X-Pad-" + std::to_string(i) + ": abcdefgh\r\n";
  const int fd = ConnectLocal(http_port_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(
      fd, RawRequest("POST", "/v1/completions", R"({"prompt": "Hello", "max_tokens": 2})", many)));
  auto r = ReadResponse(fd);
  close(fd);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 431) << r->head;
  json j = json::parse(r->body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r->body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_EQ(MetricValue(HttpGetBody(metrics_port_, "/metrics"), "tandem_num_requests_running"), 0);
  auto ok = Post("/v1/completions", R"({"prompt": "Hello", "max_tokens": 2})");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

absl::StatusOr<tandem::v1::WorkerStats> DecodeStats(const std::string& address) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  tandem::v1::WorkerStats stats;
  grpc::Status s = tandem::v1::DecodeWorker::NewStub(channel)->GetStats(&ctx, {}, &stats);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  return stats;
}

// A disaggregated `tandem serve`: the same answers as gRPC, and a client
// that goes away mid-stream leaves no KV on the decode worker.
// With --served-model-name every process uses that name: the API's `model`
// and every service's metrics label.
TEST(OpenAiHttpClusterTest, CompletionAndDisconnectFreesDecodeKv) {
  ServeProcess serve;
  ASSERT_EQ(serve.Start({"--served-model-name", "smol-test"}), "");
  const int http_port = PortOf(serve.endpoints()[0].http_address);
  const std::string decode = serve.Address("decode");
  ASSERT_FALSE(decode.empty());

  tandem::v1::GenerateRequest g;
  g.set_text("The capital of France is");
  g.mutable_sampling()->set_temperature(0);
  g.mutable_stop()->set_max_tokens(8);
  const GrpcResult want = GrpcGenerate(serve.Address("router"), g);
  httplib::Client c("127.0.0.1", http_port);
  c.set_read_timeout(std::chrono::seconds(120));
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "smol-test");
  auto r = c.Post("/v1/completions",
                  R"({"model": "smol-test", "prompt": "The capital of France is", "max_tokens": 8,
                      "temperature": 0})",
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["model"], "smol-test");
  EXPECT_EQ(j["choices"][0]["text"], want.text);
  EXPECT_EQ(j["usage"]["completion_tokens"], want.completion_tokens);
  auto wrong = c.Post("/v1/completions", R"({"model": "other", "prompt": "Hi", "max_tokens": 1})",
                      "application/json");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 404) << wrong->body;
  for (const Endpoint& e : serve.endpoints()) {
    const std::string text = HttpGetBody(PortOf(e.metrics_address), "/metrics");
    EXPECT_NE(text.find("model=\"smol-test\""), std::string::npos) << e.role;
  }

  StreamThenDisconnect(http_port, [&] {
    // The first token comes from the prefill worker; wait for the decode
    // worker to hold the request's blocks.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    int64_t used = 0;
    while (used == 0 && std::chrono::steady_clock::now() < until) {
      auto s = DecodeStats(decode);
      if (s.ok()) used = s->num_blocks_used();
      if (used == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_GT(used, 0);
  });
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  tandem::v1::WorkerStats last;
  while (std::chrono::steady_clock::now() < give_up) {
    auto s = DecodeStats(decode);
    if (s.ok()) last = *s;
    if (s.ok() && s->num_blocks_used() == 0 && s->num_running() == 0 && s->num_leases() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(last.num_blocks_used(), 0);
  EXPECT_EQ(last.num_running(), 0);
  EXPECT_EQ(last.num_leases(), 0);
  EXPECT_EQ(serve.Stop(), 0);
}

TEST(OpenAiHttpClusterTest, BadServedModelNameIsAUsageError) {
  for (const std::string& bad :
       {std::string("a\x01b"), std::string("bad\xffutf8"), std::string(257, 'x')}) {
    ProcessResult r = RunProcess({TandemBinary(), "serve", "--served-model-name", bad});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--served-model-name"), std::string::npos) << r.err;
  }
}

// --api-key-file: 401 without / with a wrong bearer key; --max-inflight 1:
// a second call while one streams gets 429 with Retry-After.
TEST(OpenAiHttpLimitsTest, ApiKeyAndOverload) {
  ServeProcess serve;
  char dir_template[] = "/tmp/tandem_openai_keys_XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string keys = dir + "/keys.txt";
  std::ofstream(keys) << "sk-test-key\n";
  ASSERT_EQ(serve.Start({"--colocated", "--max-inflight", "1", "--api-key-file", keys}), "");
  const int http_port = PortOf(serve.endpoints()[0].http_address);
  const std::string body = R"({"prompt": "Hi", "max_tokens": 2})";
  httplib::Client c("127.0.0.1", http_port);
  c.set_read_timeout(std::chrono::seconds(60));
  auto check = [&](const httplib::Headers& headers, int status) {
    auto r = c.Post("/v1/completions", headers, body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << r->body;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_FALSE(j.is_discarded());
    if (status != 200) {
      EXPECT_TRUE(j["error"]["message"].is_string());
      if (status == 401) {
        EXPECT_EQ(j["error"]["code"], "invalid_api_key");
      }
      if (status == 429) {
        EXPECT_EQ(r->get_header_value("Retry-After"), "1");
      }
    }
  };
  check({}, 401);
  check({{"Authorization", "Bearer wrong"}}, 401);
  check({{"Authorization", "Basic abc"}}, 401);
  check({{"Authorization", "Bearer sk-test-key"}}, 200);
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  auto health = c.Get("/health");  // no key needed
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);

  StreamThenDisconnect(
      http_port,
      [&] {
        check({{"Authorization", "Bearer sk-test-key"}}, 429);
      },
      "Authorization: Bearer sk-test-key\r\n");
  // The slot comes back once the disconnected stream is cancelled.
  const int metrics_port = PortOf(serve.endpoints()[0].metrics_address);
  EXPECT_TRUE(WaitRouterIdle(metrics_port));
  check({{"Authorization", "Bearer sk-test-key"}}, 200);
  EXPECT_EQ(serve.Stop(), 0);
}

}  // namespace
}  // namespace tandem::testing
