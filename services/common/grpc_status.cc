#include "services/common/grpc_status.h"

#include <map>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace tandem::services {
namespace {

constexpr char kRetryInfoType[] = "type.googleapis.com/google.rpc.RetryInfo";

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void AppendBytesField(int field, const std::string& bytes, std::string* out) {
  AppendVarint(static_cast<uint64_t>(field) << 3 | 2, out);
  AppendVarint(bytes.size(), out);
  out->append(bytes);
}

// A minimal protobuf wire reader: enough for google.rpc.Status, Any,
// RetryInfo and Duration. Every read is bounds-checked.
struct WireReader {
  std::string_view in;
  bool ReadVarint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
      const uint8_t b = static_cast<uint8_t>(in.front());
      in.remove_prefix(1);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // One field: its number, wire type, and value (varint or bytes).
  bool Next(int* field, int* type, uint64_t* varint, std::string_view* bytes) {
    uint64_t key = 0;
    if (!ReadVarint(&key)) return false;
    *field = static_cast<int>(key >> 3);
    *type = static_cast<int>(key & 7);
    switch (*type) {
      case 0:
        return ReadVarint(varint);
      case 1:
      case 5: {
        const size_t n = *type == 1 ? 8 : 4;
        if (in.size() < n) return false;
        in.remove_prefix(n);
        return true;
      }
      case 2: {
        uint64_t len = 0;
        if (!ReadVarint(&len) || len > in.size()) return false;
        *bytes = in.substr(0, len);
        in.remove_prefix(len);
        return true;
      }
      default:
        return false;
    }
  }
};

// Duration{seconds = 1, nanos = 2}.
std::optional<absl::Duration> ParseDuration(std::string_view bytes) {
  WireReader r{bytes};
  int64_t secs = 0, nanos = 0;
  int field = 0, type = 0;
  uint64_t v = 0;
  std::string_view b;
  while (!r.in.empty()) {
    if (!r.Next(&field, &type, &v, &b)) return std::nullopt;
    if (type != 0) continue;
    if (field == 1) secs = static_cast<int64_t>(v);
    if (field == 2) nanos = static_cast<int64_t>(static_cast<int32_t>(v));
  }
  if (secs < 0 || nanos < 0) return std::nullopt;
  return absl::Seconds(secs) + absl::Nanoseconds(nanos);
}

class RetryHintInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit RetryHintInterceptor(absl::Duration retry_after) : retry_after_(retry_after) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status s = methods->GetSendStatus();
      if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && s.error_details().empty()) {
        const std::string message = absl::StrFormat(
            "%s; retry after %s",
            s.error_message().empty() ? "the server's RPC threads are all busy" : s.error_message(),
            absl::FormatDuration(retry_after_));
        methods->ModifySendStatus(ResourceExhaustedWithRetry(message, retry_after_));
        std::multimap<std::string, std::string>* trailers = methods->GetSendTrailingMetadata();
        if (trailers != nullptr && trailers->count(kRetryAfterMetadataKey) == 0) {
          trailers->emplace(kRetryAfterMetadataKey,
                            std::to_string(absl::ToInt64Milliseconds(retry_after_)));
        }
      }
    }
    methods->Proceed();
  }

 private:
  const absl::Duration retry_after_;
};

class RetryHintInterceptorFactoryImpl final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RetryHintInterceptorFactoryImpl(absl::Duration retry_after)
      : retry_after_(retry_after) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RetryHintInterceptor(retry_after_);
  }

 private:
  const absl::Duration retry_after_;
};

}  // namespace

grpc::Status ResourceExhaustedWithRetry(const std::string& message, absl::Duration retry_after) {
  // google.rpc.Status{code, message, details: [Any{RetryInfo{retry_delay}}]}.
  std::string duration;
  if (retry_after < absl::ZeroDuration()) retry_after = absl::ZeroDuration();
  const int64_t secs = absl::IDivDuration(retry_after, absl::Seconds(1), &retry_after);
  const int64_t nanos = absl::ToInt64Nanoseconds(retry_after);
  if (secs > 0) {
    AppendVarint(0x08, &duration);
    AppendVarint(static_cast<uint64_t>(secs), &duration);
  }
  if (nanos > 0) {
    AppendVarint(0x10, &duration);
    AppendVarint(static_cast<uint64_t>(nanos), &duration);
  }
  std::string retry_info;
  AppendBytesField(1, duration, &retry_info);
  std::string any;
  AppendBytesField(1, kRetryInfoType, &any);
  AppendBytesField(2, retry_info, &any);
  std::string status;
  AppendVarint(0x08, &status);
  AppendVarint(static_cast<uint64_t>(grpc::StatusCode::RESOURCE_EXHAUSTED), &status);
  AppendBytesField(2, message, &status);
  AppendBytesField(3, any, &status);
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, message, status);
}

std::optional<absl::Duration> RetryInfoDelay(const grpc::Status& status) {
  const std::string& details = status.error_details();
  WireReader st{details};
  int field = 0, type = 0;
  uint64_t v = 0;
  std::string_view any;
  while (!st.in.empty()) {
    if (!st.Next(&field, &type, &v, &any)) return std::nullopt;
    if (field != 3 || type != 2) continue;
    WireReader a{any};
    std::string_view type_url, value, b;
    while (!a.in.empty()) {
      if (!a.Next(&field, &type, &v, &b)) return std::nullopt;
      if (type != 2) continue;
      if (field == 1) type_url = b;
      if (field == 2) value = b;
    }
    if (type_url != kRetryInfoType) continue;
    WireReader ri{value};
    std::optional<absl::Duration> delay = absl::ZeroDuration();  // retry_delay unset = 0
    while (!ri.in.empty()) {
      if (!ri.Next(&field, &type, &v, &b)) return std::nullopt;
      if (field == 1 && type == 2) delay = ParseDuration(b);
    }
    return delay;
  }
  return std::nullopt;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RetryHintInterceptorFactory(
    absl::Duration retry_after) {
  return std::make_unique<RetryHintInterceptorFactoryImpl>(retry_after);
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

void SetRetryAfter(grpc::ServerContextBase* context, absl::Duration delay) {
  context->AddTrailingMetadata(kRetryAfterMetadataKey,
                               std::to_string(absl::ToInt64Milliseconds(delay)));
}

grpc::Status ToGrpcStatus(const absl::Status& status, grpc::ServerContextBase* context,
                          absl::Duration retry_after) {
  if (status.code() != absl::StatusCode::kResourceExhausted) return ToGrpcStatus(status);
  if (context != nullptr) SetRetryAfter(context, retry_after);
  return ResourceExhaustedWithRetry(std::string(status.message()), retry_after);
}

std::optional<absl::Duration> RetryAfter(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(kRetryAfterMetadataKey);
  if (it == trailers.end()) return std::nullopt;
  int64_t ms = 0;
  if (!absl::SimpleAtoi(std::string(it->second.data(), it->second.size()), &ms) || ms < 0) {
    return std::nullopt;
  }
  return absl::Milliseconds(ms);
}

}  // namespace tandem::services
