#include "services/transfer/kv_push_receiver.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::transfer {

KvPushReceiver::KvPushReceiver(KvLeaseTable* leases, KvPushLimits limits)
    : leases_(leases), limits_(std::move(limits)) {}

KvPushReceiver::~KvPushReceiver() { Abort(); }

absl::Status KvPushReceiver::Validate(const tandem::v1::KvTransferHeader& header) {
  TANDEM_RETURN_IF_ERROR(ValidateKvHeader(header, limits_.compat, limits_.bytes_per_token,
                                          limits_.max_tokens, limits_.vocab_size));
  header_ = header;
  return absl::OkStatus();
}

absl::Status KvPushReceiver::Reserve(int64_t capacity_bytes) {
  TANDEM_CHECK(!reserved_ && !header_.kv_handle().empty());
  TANDEM_RETURN_IF_ERROR(
      leases_->Reserve(header_.kv_handle(), header_.total_bytes(), capacity_bytes));
  reserved_ = true;
  kv_ = std::make_shared<engine::KvExport>();
  kv_->token_ids.assign(header_.token_ids().begin(), header_.token_ids().end());
  kv_->num_layers = limits_.num_layers;
  kv_->num_kv_heads = limits_.num_kv_heads;
  kv_->head_dim = limits_.head_dim;
  kv_->bytes_per_token = header_.bytes_per_token();
  kv_->bytes.resize(header_.total_bytes());  // declared and bounded by Validate
  return absl::OkStatus();
}

absl::Status KvPushReceiver::AddData(std::string_view data) {
  TANDEM_CHECK(reserved_);
  const int64_t n = static_cast<int64_t>(data.size());
  if (n > limits_.max_chunk_bytes) {
    Abort();
    return absl::InvalidArgumentError(
        absl::StrCat("PushKv: a data chunk of ", n, " bytes exceeds the ",
                     limits_.max_chunk_bytes >> 20, " MiB chunk limit"));
  }
  if (received_ + n > header_.total_bytes()) {
    Abort();
    return absl::InvalidArgumentError(
        absl::StrCat("PushKv: more data than the declared total_bytes ", header_.total_bytes()));
  }
  if (n > 0) std::memcpy(kv_->bytes.data() + received_, data.data(), data.size());
  received_ += n;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> KvPushReceiver::Commit() {
  TANDEM_CHECK(reserved_);
  if (received_ != header_.total_bytes()) {
    Abort();
    return absl::InvalidArgumentError(
        absl::StrCat("PushKv: got ", received_, " of total_bytes ", header_.total_bytes()));
  }
  reserved_ = false;  // Commit consumes the reservation either way
  if (!leases_->Commit(header_.kv_handle(), std::move(kv_))) {
    return absl::AbortedError(
        "PushKv: the handoff was released while it arrived (request aborted)");
  }
  return received_;
}

void KvPushReceiver::Abort() {
  if (!reserved_) return;
  reserved_ = false;
  leases_->Abort(header_.kv_handle());
  kv_.reset();
}

}  // namespace tandem::transfer
