// KvLeaseTable: the decode worker's KV handoffs received but not yet adopted.
//
// A handoff is first Reserved (while its PushKv stream is still arriving:
// the declared size counts against capacity at once, so concurrent pushes
// cannot overcommit), then Committed with its KvExport under a lease that
// expires `lease` later, then Claimed by Decode (one-shot) or Released
// (idempotent) or reaped at expiry. A Release that arrives before or during
// the push (the router aborted the request while the prefill worker was
// still sending) leaves a tombstone for one lease period: the push is then
// refused (Reserve: Aborted) or dropped at Commit, so no lease outlives an
// aborted request even when the release overtakes the bytes. Leased K/V lives in host memory here
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
  // Aborted when it was released already; ResourceExhausted when held +
  // bytes > capacity_bytes.
  absl::Status Reserve(const std::string& handle, int64_t bytes, int64_t capacity_bytes);
  // Turns a reservation into a lease expiring at now + lease(); false (and
  // the reservation dropped) when the handle was released meanwhile.
  // REQUIRES: Reserve(handle) succeeded and kv->payload_bytes() == the reserved
  // bytes (host bytes, or device memory: KvExport::device).
  bool Commit(const std::string& handle, std::shared_ptr<const engine::KvExport> kv,
              absl::Time now = absl::Now());
  // Drops a reservation (failed push). No-op when unknown.
  void Abort(const std::string& handle);

  // Takes the lease (one-shot). NotFound when unknown, expired or claimed.
  absl::StatusOr<std::shared_ptr<const engine::KvExport>> Claim(const std::string& handle,
                                                                absl::Time now = absl::Now());
  // Drops the lease, or marks a push still arriving to be dropped; false
  // when no lease was held (idempotent). Leaves a tombstone either way.
  bool Release(const std::string& handle, absl::Time now = absl::Now());
  // Frees leases expired at `now` (and old tombstones); returns how many leases.
  int ReapExpired(absl::Time now = absl::Now());
  void StartReaper(absl::Duration period);

  KvLeaseStats Stats() const;
  int64_t num_leased_blocks() const;  // sum over leases of ceil(tokens / block_size)

 private:
  struct Entry {
    int64_t bytes = 0;
    bool committed = false;
    bool released = false;  // Release() while still reserved: dropped at Commit
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
  // Released handles -> when to forget them (bounded: kMaxTombstones).
  absl::flat_hash_map<std::string, absl::Time> tombstones_ ABSL_GUARDED_BY(mu_);
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
