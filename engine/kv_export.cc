#include "engine/kv_export.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::engine {

absl::Status KvExport::Validate() const {
  if (num_layers < 1) return absl::InvalidArgumentError("num_layers must be >= 1");
  if (num_kv_heads < 1) return absl::InvalidArgumentError("num_kv_heads must be >= 1");
  if (head_dim < 1) return absl::InvalidArgumentError("head_dim must be >= 1");
  if (num_layers > (int64_t{1} << 20) || num_kv_heads > (int64_t{1} << 20) ||
      head_dim > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError("KV geometry is too large");
  }
  bool known = false;
  for (KvDtype d : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBf16, KvDtype::kInt8, KvDtype::kFp8}) {
    known = known || bytes_per_token == BytesPerToken(num_layers, num_kv_heads, head_dim, d);
  }
  if (!known) {
    return absl::InvalidArgumentError(absl::StrCat("bytes_per_token ", bytes_per_token,
                                                   " does not match the geometry in any KV dtype"));
  }
  if (device != nullptr && !bytes.empty()) {
    return absl::InvalidArgumentError("kv payload both in host bytes and in device memory");
  }
  if (payload_bytes() != num_tokens() * bytes_per_token) {
    return absl::InvalidArgumentError(absl::StrCat("kv bytes ", payload_bytes(), " != num_tokens ",
                                                   num_tokens(), " x bytes_per_token ",
                                                   bytes_per_token));
  }
  return absl::OkStatus();
}

namespace {

std::vector<int64_t> SlotsOf(const KvCacheManager& kv, SeqId seq, int64_t begin, int64_t end) {
  std::vector<int64_t> slots;
  slots.reserve(end - begin);
  for (int64_t t = begin; t < end; ++t) slots.push_back(kv.Slot(seq, t));
  return slots;
}

}  // namespace

absl::StatusOr<KvExport> ExportKv(Executor& executor, const KvCacheManager& kv, SeqId seq,
                                  absl::Span<const int32_t> token_ids) {
  const KvCacheShape& shape = executor.kv_shape();
  KvExport out;
  out.token_ids.assign(token_ids.begin(), token_ids.end());
  out.num_layers = shape.num_layers;
  out.num_kv_heads = shape.layout.num_kv_heads;
  out.head_dim = shape.layout.head_dim;
  out.bytes_per_token = shape.bytes_per_token();
  TANDEM_RETURN_IF_ERROR(ReadKvRange(executor, kv, seq, 0, out.num_tokens(), &out.bytes));
  return out;
}

absl::Status ReadKvRange(Executor& executor, const KvCacheManager& kv, SeqId seq, int64_t begin,
                         int64_t end, std::string* bytes) {
  const KvCacheShape& shape = executor.kv_shape();
  bytes->resize((end - begin) * shape.bytes_per_token());
  return executor.ReadKv(SlotsOf(kv, seq, begin, end), bytes->data());
}

absl::StatusOr<std::shared_ptr<const KvDeviceBytes>> ReadKvRangeToDevice(Executor& executor,
                                                                         const KvCacheManager& kv,
                                                                         SeqId seq, int64_t begin,
                                                                         int64_t end) {
  TANDEM_ASSIGN_OR_RETURN(
      std::shared_ptr<KvDeviceBytes> out,
      executor.AllocKvDevice((end - begin) * executor.kv_shape().bytes_per_token()));
  TANDEM_RETURN_IF_ERROR(executor.ReadKvDevice(SlotsOf(kv, seq, begin, end), out->data()));
  return std::shared_ptr<const KvDeviceBytes>(std::move(out));
}

absl::Status ImportKv(const KvExport& src, int64_t begin, int64_t end, const KvCacheManager& kv,
                      SeqId seq, Executor& executor) {
  const KvCacheShape& shape = executor.kv_shape();
  if (src.num_layers != shape.num_layers || src.num_kv_heads != shape.layout.num_kv_heads ||
      src.head_dim != shape.layout.head_dim) {
    return absl::InvalidArgumentError("imported KV geometry does not match the cache");
  }
  if (src.bytes_per_token != shape.bytes_per_token()) {
    return absl::InvalidArgumentError(
        absl::StrCat("imported KV has ", src.bytes_per_token, " bytes per token, the ",
                     kernels::KvDtypeName(shape.dtype), " KV cache ", shape.bytes_per_token()));
  }
  if (src.payload_bytes() < end * src.bytes_per_token) {
    return absl::InvalidArgumentError("imported KV bytes shorter than its tokens");
  }
  if (!(0 <= begin && begin <= end && end <= src.num_tokens())) {
    return absl::InvalidArgumentError(absl::StrCat("imported KV range [", begin, ", ", end,
                                                   ") outside its ", src.num_tokens(), " tokens"));
  }
  if (src.device != nullptr) {
    if (src.device->domain() != executor.kv_memory_domain()) {
      return absl::FailedPreconditionError(absl::StrCat("imported KV is in ", src.device->domain(),
                                                        " memory, the KV cache in ",
                                                        executor.kv_memory_domain()));
    }
    return executor.WriteKvDevice(
        SlotsOf(kv, seq, begin, end),
        static_cast<const char*>(src.device->data()) + begin * src.bytes_per_token);
  }
  return executor.WriteKv(SlotsOf(kv, seq, begin, end),
                          src.bytes.data() + begin * src.bytes_per_token);
}

}  // namespace tandem::engine
