// The retry hint every Tandem server sends with RESOURCE_EXHAUSTED
// (services/common/grpc_status.h): google.rpc.Status + RetryInfo in the
// status details, decoded here with protobuf's own parser (UnknownFieldSet,
// Any, Duration) so the hand-written encoder is checked independently; and
// gRPC's thread-quota RESOURCE_EXHAUSTED given the same hints by the
// interceptor.
#include "services/common/grpc_status.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "google/protobuf/any.pb.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/util/wait.h"

namespace tandem::services {
namespace {

struct Decoded {
  int64_t code = -1;
  std::string message;
  std::string type_url;
  int64_t seconds = -1;
  int64_t nanos = -1;
};

// google.rpc.Status{1: code, 2: message, 3: Any{type_url, value: RetryInfo{1: Duration}}}.
Decoded Decode(const std::string& details) {
  Decoded d;
  google::protobuf::UnknownFieldSet status;
  if (!status.ParseFromString(details)) return d;
  for (int i = 0; i < status.field_count(); ++i) {
    const google::protobuf::UnknownField& f = status.field(i);
    if (f.number() == 1 && f.type() == google::protobuf::UnknownField::TYPE_VARINT) {
      d.code = static_cast<int64_t>(f.varint());
    } else if (f.number() == 2 &&
               f.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
      d.message = f.length_delimited();
    } else if (f.number() == 3 &&
               f.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
      google::protobuf::Any any;
      if (!any.ParseFromString(f.length_delimited())) continue;
      d.type_url = any.type_url();
      google::protobuf::UnknownFieldSet retry_info;
      if (!retry_info.ParseFromString(any.value())) continue;
      for (int k = 0; k < retry_info.field_count(); ++k) {
        if (retry_info.field(k).number() != 1) continue;
        google::protobuf::Duration delay;
        if (delay.ParseFromString(retry_info.field(k).length_delimited())) {
          d.seconds = delay.seconds();
          d.nanos = delay.nanos();
        }
      }
    }
  }
  return d;
}

TEST(GrpcStatusTest, ResourceExhaustedWithRetryIsAGoogleRpcStatusWithRetryInfo) {
  const grpc::Status s = ResourceExhaustedWithRetry("queue full", absl::Milliseconds(1500));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "queue full");
  const Decoded d = Decode(s.error_details());
  EXPECT_EQ(d.code, 8);  // RESOURCE_EXHAUSTED
  EXPECT_EQ(d.message, "queue full");
  EXPECT_EQ(d.type_url, "type.googleapis.com/google.rpc.RetryInfo");
  EXPECT_EQ(d.seconds, 1);
  EXPECT_EQ(d.nanos, 500000000);
  EXPECT_EQ(RetryInfoDelay(s), absl::Milliseconds(1500));
  EXPECT_EQ(RetryInfoDelay(ResourceExhaustedWithRetry("x", absl::Seconds(2))), absl::Seconds(2));
  EXPECT_EQ(RetryInfoDelay(ResourceExhaustedWithRetry("x", absl::Milliseconds(100))),
            absl::Milliseconds(100));
}

TEST(GrpcStatusTest, ToGrpcStatusAddsDetailsOnlyForResourceExhausted) {
  const grpc::Status re =
      ToGrpcStatus(absl::ResourceExhaustedError("full"), nullptr, absl::Milliseconds(250));
  EXPECT_EQ(re.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(RetryInfoDelay(re), absl::Milliseconds(250));
  const grpc::Status bad = ToGrpcStatus(absl::InvalidArgumentError("bad"), nullptr);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(bad.error_details().empty());
  EXPECT_EQ(RetryInfoDelay(bad), std::nullopt);
}

TEST(GrpcStatusTest, RetryInfoDelayRejectsMalformedDetails) {
  for (const std::string& junk :
       {std::string(), std::string("\xff\xff\xff"), std::string("\x1a\x7f", 2),
        std::string("\x08\x08\x1a\x05\x0a\x03"
                    "abc",
                    9)}) {
    EXPECT_EQ(RetryInfoDelay(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "m", junk)),
              std::nullopt);
  }
}

// GetStats blocks until released, so each call holds one server thread.
class BlockingWorker final : public tandem::v1::PrefillWorker::Service {
 public:
  grpc::Status GetStats(grpc::ServerContext*, const tandem::v1::WorkerStatsRequest*,
                        tandem::v1::WorkerStats*) override {
    ++running;
    release.WaitForNotificationWithTimeout(absl::Seconds(30));
    return grpc::Status::OK;
  }
  std::atomic<int> running{0};
  absl::Notification release;
};

TEST(GrpcStatusTest, ThreadQuotaExhaustionCarriesRetryHints) {
  BlockingWorker service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  grpc::ResourceQuota quota("grpc_status_test");
  quota.SetMaxThreads(4);
  builder.SetResourceQuota(quota);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> hooks;
  hooks.push_back(RetryHintInterceptorFactory(absl::Milliseconds(300)));
  builder.experimental().SetInterceptorCreators(std::move(hooks));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = tandem::v1::PrefillWorker::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));

  constexpr int kCalls = 16;
  std::vector<grpc::Status> statuses(kCalls);
  std::vector<std::optional<absl::Duration>> trailers(kCalls);
  std::vector<absl::Duration> took(kCalls);
  std::atomic<int> returned{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kCalls; ++i) {
    threads.emplace_back([&, i] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
      tandem::v1::WorkerStats stats;
      const absl::Time start = absl::Now();
      statuses[i] = stub->GetStats(&ctx, {}, &stats);
      took[i] = absl::Now() - start;
      trailers[i] = RetryAfter(ctx);
      ++returned;
    });
  }
  // Every call either blocks in the handler or has been turned away.
  EXPECT_TRUE(testing::WaitFor([&] { return service.running.load() + returned.load() == kCalls; },
                               absl::Seconds(20)))
      << service.running.load() << " running, " << returned.load() << " returned";
  service.release.Notify();
  for (auto& t : threads) t.join();
  int exhausted = 0;
  for (int i = 0; i < kCalls; ++i) {
    if (statuses[i].ok()) continue;
    ASSERT_EQ(statuses[i].error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << statuses[i].error_message();
    ++exhausted;
    EXPECT_EQ(RetryInfoDelay(statuses[i]), absl::Milliseconds(300)) << i;
    EXPECT_EQ(trailers[i], absl::Milliseconds(300)) << i;
    EXPECT_NE(statuses[i].error_message().find("retry after"), std::string::npos);
    EXPECT_LT(took[i], absl::Seconds(1)) << "turned away at once, not after the release";
  }
  // 4 threads: some calls run (blocked), the rest are refused by gRPC itself.
  EXPECT_GT(service.running.load(), 0);
  EXPECT_LT(service.running.load(), kCalls);
  EXPECT_GT(exhausted, 0);
  EXPECT_EQ(exhausted + service.running.load(), kCalls);
  server->Shutdown();
}

}  // namespace
}  // namespace tandem::services
