// KvLeaseTable: the decode worker's KV handoffs received but not yet adopted.
//
// A handoff is first Reserved (while its PushKv stream is still arriving:
// the declared size counts against capacity at once, so concurrent pushes
// cannot overcommit), then Committed with its KvExport under a lease that
// expires `lease` later, then Claimed by Decode (one-shot) or Released
// (idempotent) or reaped at expiry. Leased K/V lives in host memory here
// (the decode engine adopts it into paged blocks at Decode); its size counts
// against the worker's free KV capacity, so a lease stands for blocks.
//
// Thread safety: thread-safe. The reaper thread (StartReaper) runs
// ReapExpired periodically until destruction.
#ifndef TANDEM_SERVICES_TRANSFER_KV_LEASE_TABLE_H_
#define TANDEM_SERVICES_TRANSFER_KV_LEASE_TABLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/kv_export.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::transfer {

struct KvLeaseStats {
  int64_t num_leases = 0;    // committed, unclaimed
  int64_t num_reserved = 0;  // pushes in flight
  int64_t num_bytes = 0;     // leased + reserved
  int64_t num_tokens = 0;    // leased
  int64_t num_expired = 0;   // reaped so far
};

class KvLeaseTable {
 public:
  KvLeaseTable(absl::Duration lease, int32_t block_size);
  ~KvLeaseTable();  // stops the reaper
  KvLeaseTable(const KvLeaseTable&) = delete;
  KvLeaseTable& operator=(const KvLeaseTable&) = delete;

  absl::Duration lease() const { return lease_; }

  // Reserves `bytes` for `handle`. AlreadyExists when the handle is known;
  // ResourceExhausted when held + bytes > capacity_bytes.
  absl::Status Reserve(const std::string& handle, int64_t bytes, int64_t capacity_bytes);
  // Turns a reservation into a lease expiring at now + lease().
  // REQUIRES: Reserve(handle) succeeded and kv->bytes.size() == the reserved bytes.
  void Commit(const std::string& handle, std::shared_ptr<const engine::KvExport> kv,
              absl::Time now = absl::Now());
  // Drops a reservation (failed push). No-op when unknown.
  void Abort(const std::string& handle);

  // Takes the lease (one-shot). NotFound when unknown, expired or claimed.
  absl::StatusOr<std::shared_ptr<const engine::KvExport>> Claim(const std::string& handle,
                                                                absl::Time now = absl::Now());
  // Drops the lease; false when nothing was held (idempotent).
  bool Release(const std::string& handle);
  // Frees leases expired at `now`; returns how many.
  int ReapExpired(absl::Time now = absl::Now());
  void StartReaper(absl::Duration period);

  KvLeaseStats Stats() const;
  int64_t num_leased_blocks() const;  // sum over leases of ceil(tokens / block_size)

 private:
  struct Entry {
    int64_t bytes = 0;
    bool committed = false;
    absl::Time expiry = absl::InfiniteFuture();
    std::shared_ptr<const engine::KvExport> kv;
  };
  void Erase(absl::flat_hash_map<std::string, Entry>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration lease_;
  const int32_t block_size_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  int64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t num_expired_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar cv_;
  std::thread reaper_;
};

// Checks a PushKv header against this worker before any payload byte:
// compat (FailedPrecondition naming the field), then kv_handle non-empty,
// num_tokens in [1, max_tokens], bytes_per_token == ours, token_ids size ==
// num_tokens and each in [0, vocab_size), total_bytes == num_tokens *
// bytes_per_token (InvalidArgument naming the field).
absl::Status ValidateKvHeader(const tandem::v1::KvTransferHeader& header,
                              const tandem::v1::KvCompatibility& ours, int64_t bytes_per_token,
                              int64_t max_tokens, int64_t vocab_size);

}  // namespace tandem::transfer

#endif  // TANDEM_SERVICES_TRANSFER_KV_LEASE_TABLE_H_
