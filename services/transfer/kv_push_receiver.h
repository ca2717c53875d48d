// KvPushReceiver: the decode side of one host KV handoff (DecodeWorker.PushKv),
// independent of gRPC so the same code serves the RPC and the fuzzer
// (tests/fuzz/kv_push_fuzz.cc).
//
// Protocol: Validate(header) checks it against this worker before anything
// is allocated; Reserve() counts its declared size against free KV capacity
// in the lease table; AddData() appends payload within the declared size;
// Commit() checks the total and turns the reservation into a lease. Any
// failure after Reserve (a bad chunk, a short stream, a cancel, or the
// receiver destroyed before Commit) aborts the reservation, so nothing is
// held for a push that did not complete.
//
// Thread safety: one receiver per stream, used by one thread.
#ifndef TANDEM_SERVICES_TRANSFER_KV_PUSH_RECEIVER_H_
#define TANDEM_SERVICES_TRANSFER_KV_PUSH_RECEIVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/kv_export.h"
#include "engine/model_config.h"
#include "services/transfer/kv_lease_table.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::transfer {

struct KvPushLimits {
  tandem::v1::KvCompatibility compat;  // this worker's
  int64_t bytes_per_token = 0;         // this worker's KV bytes per token
  int64_t max_tokens = 0;              // context length - 1
  int64_t vocab_size = 0;
  int64_t num_layers = 0, num_kv_heads = 0, head_dim = 0;
  int64_t max_chunk_bytes = 0;  // kMaxChunkBytes
};

class KvPushReceiver {
 public:
  // `leases` not owned; must outlive the receiver.
  KvPushReceiver(KvLeaseTable* leases, KvPushLimits limits);
  ~KvPushReceiver();  // aborts a reservation not committed
  KvPushReceiver(const KvPushReceiver&) = delete;
  KvPushReceiver& operator=(const KvPushReceiver&) = delete;

  // ValidateKvHeader against the limits (InvalidArgument / FailedPrecondition
  // naming the field). Keeps the header.
  absl::Status Validate(const tandem::v1::KvTransferHeader& header);
  // Reserves the declared size (lease table codes: ResourceExhausted,
  // AlreadyExists, Aborted). REQUIRES: Validate succeeded.
  absl::Status Reserve(int64_t capacity_bytes);
  // Appends one data chunk: InvalidArgument (and the reservation aborted)
  // above max_chunk_bytes or past total_bytes. REQUIRES: Reserve succeeded.
  absl::Status AddData(std::string_view data);
  // InvalidArgument (aborted) when fewer than total_bytes arrived; Aborted
  // when the handoff was released while it arrived. Returns the bytes.
  absl::StatusOr<int64_t> Commit();
  // Drops the reservation (cancel). Idempotent.
  void Abort();

 private:
  KvLeaseTable* leases_;
  KvPushLimits limits_;
  tandem::v1::KvTransferHeader header_;
  std::shared_ptr<engine::KvExport> kv_;
  int64_t received_ = 0;
  bool reserved_ = false;
};

}  // namespace tandem::transfer

#endif  // TANDEM_SERVICES_TRANSFER_KV_PUSH_RECEIVER_H_
