// The gRPC backend of `tandem bench`: tandem.v1.Generation/Generate.
#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/serve/backend.h"
#include "grpcpp/create_channel.h"
#include "services/common/api_key.h"
#include "services/common/convert.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem::bench {
namespace {

std::string CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::OK:
      return "OK";
    case grpc::CANCELLED:
      return "CANCELLED";
    case grpc::UNKNOWN:
      return "UNKNOWN";
    case grpc::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::ABORTED:
      return "ABORTED";
    case grpc::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::INTERNAL:
      return "INTERNAL";
    case grpc::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return absl::StrCat("CODE_", static_cast<int>(code));
  }
}

double MsSince(absl::Time t0) { return absl::ToDoubleMilliseconds(absl::Now() - t0); }

class GrpcBackend : public Backend {
 public:
  GrpcBackend(const std::string& address, const services::ChannelSecurity& security,
              const std::string& api_key)
      : authorization_(api_key.empty() ? "" : "Bearer " + api_key) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    stub_ = tandem::v1::Generation::NewStub(services::CreateChannel(address, security, args));
  }
  void Authorize(grpc::ClientContext* ctx) const {
    if (!authorization_.empty()) {
      ctx->AddMetadata(services::kAuthorizationMetadataKey, authorization_);
    }
  }

  absl::StatusOr<ServerInfo> Probe(absl::Time deadline) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    ctx.set_wait_for_ready(true);
    Authorize(&ctx);
    tandem::v1::ModelInfo info;
    grpc::Status s = stub_->GetModelInfo(&ctx, tandem::v1::GetModelInfoRequest(), &info);
    if (!s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("GetModelInfo: ", CodeName(s.error_code()), ": ", s.error_message()));
    }
    ServerInfo out;
    out.model = info.model_name();
    out.vocab_size = info.vocab_size();
    out.context_length = info.context_length();
    return out;
  }

  RequestRecord Send(const BenchRequest& request, absl::Time deadline) override {
    tandem::v1::GenerateRequest req;
    if (!request.prompt_ids.empty()) {
      req.mutable_token_ids()->mutable_ids()->Add(request.prompt_ids.begin(),
                                                  request.prompt_ids.end());
    } else {
      req.set_text(request.prompt_text);
    }
    req.mutable_sampling()->set_temperature(0.0);
    req.mutable_sampling()->set_seed(request.seed);
    req.mutable_stop()->set_max_tokens(static_cast<int32_t>(request.max_tokens));
    req.mutable_stop()->set_ignore_eos(request.ignore_eos);

    RequestRecord r;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    Authorize(&ctx);
    const absl::Time t0 = absl::Now();
    auto reader = stub_->Generate(&ctx, req);
    tandem::v1::GenerateResponse resp;
    double last_ms = 0;
    int64_t received = 0;
    bool final_seen = false;
    int64_t usage_tokens = -1;
    while (reader->Read(&resp)) {
      if (resp.token_ids_size() > 0) {
        const double now_ms = MsSince(t0);
        if (r.num_chunks == 0) {
          r.ttft_ms = now_ms;
        } else {
          r.itl_ms.push_back(now_ms - last_ms);
        }
        last_ms = now_ms;
        ++r.num_chunks;
        received += resp.token_ids_size();
      }
      if (resp.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
        final_seen = true;
        r.finish_reason = services::FinishReasonName(resp.finish_reason());
        r.prompt_tokens = resp.usage().prompt_tokens();
        r.cached_tokens = resp.usage().cached_tokens();
        usage_tokens = resp.usage().completion_tokens();
      }
    }
    grpc::Status s = reader->Finish();
    r.e2e_ms = MsSince(t0);
    r.output_tokens = received;
    if (r.prompt_tokens == 0) r.prompt_tokens = request.expected_prompt_tokens;
    if (!s.ok()) {
      r.error_code = CodeName(s.error_code());
      r.error_message = s.error_message();
    } else if (!final_seen || received == 0) {
      r.error_code = "NO_TOKENS";
      r.error_message = "stream ended without tokens or a final message";
    } else if (r.finish_reason == "deadline" || r.finish_reason == "cancelled") {
      r.error_code = r.finish_reason == "deadline" ? "DEADLINE_EXCEEDED" : "CANCELLED";
      r.error_message = "finish_reason " + r.finish_reason;
    } else if (usage_tokens >= 0 && usage_tokens != received) {
      r.error_code = "TOKEN_MISMATCH";
      r.error_message = absl::StrCat("usage says ", usage_tokens, " tokens, stream had ", received);
    } else {
      r.ok = true;
      r.error_code = "OK";
    }
    return r;
  }

 private:
  const std::string authorization_;
  std::unique_ptr<tandem::v1::Generation::Stub> stub_;
};

}  // namespace

std::unique_ptr<Backend> MakeGrpcBackend(const std::string& address,
                                         const services::ChannelSecurity& security,
                                         const std::string& api_key) {
  return std::make_unique<GrpcBackend>(address, security, api_key);
}

}  // namespace tandem::bench
