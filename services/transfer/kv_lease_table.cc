#include "services/transfer/kv_lease_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "services/common/compat.h"

namespace tandem::transfer {
namespace {
constexpr size_t kMaxTombstones = 1 << 16;
}  // namespace

KvLeaseTable::KvLeaseTable(absl::Duration lease, int32_t block_size)
    : lease_(lease), block_size_(block_size) {}

KvLeaseTable::~KvLeaseTable() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (reaper_.joinable()) reaper_.join();
}

absl::Status KvLeaseTable::Reserve(const std::string& handle, int64_t bytes,
                                   int64_t capacity_bytes) {
  absl::MutexLock lock(&mu_);
  if (entries_.contains(handle)) {
    return absl::AlreadyExistsError(absl::StrCat("kv_handle '", handle, "' already in use"));
  }
  if (tombstones_.contains(handle)) {
    return absl::AbortedError(
        absl::StrCat("kv_handle '", handle, "' was released (the request was aborted)"));
  }
  if (held_bytes_ + bytes > capacity_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("total_bytes ", bytes,
                                                     " exceeds the free KV capacity (",
                                                     capacity_bytes - held_bytes_, " bytes)"));
  }
  entries_[handle] = Entry{bytes, false, false, absl::InfiniteFuture(), nullptr};
  held_bytes_ += bytes;
  return absl::OkStatus();
}

bool KvLeaseTable::Commit(const std::string& handle, std::shared_ptr<const engine::KvExport> kv,
                          absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(handle);
  TANDEM_CHECK(it != entries_.end() && !it->second.committed);
  if (it->second.released) {
    Erase(it);
    return false;
  }
  it->second.committed = true;
  it->second.expiry = now + lease_;
  it->second.kv = std::move(kv);
  return true;
}

void KvLeaseTable::Erase(absl::flat_hash_map<std::string, Entry>::iterator it) {
  held_bytes_ -= it->second.bytes;
  entries_.erase(it);
}

void KvLeaseTable::Abort(const std::string& handle) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(handle);
  if (it != entries_.end() && !it->second.committed) Erase(it);
}

absl::StatusOr<std::shared_ptr<const engine::KvExport>> KvLeaseTable::Claim(
    const std::string& handle, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(handle);
  if (it == entries_.end() || !it->second.committed) {
    return absl::NotFoundError(
        absl::StrCat("kv_handle '", handle, "': no lease (unknown, expired or claimed)"));
  }
  if (it->second.expiry <= now) {
    Erase(it);
    ++num_expired_;
    return absl::NotFoundError(absl::StrCat("kv_handle '", handle, "': lease expired"));
  }
  std::shared_ptr<const engine::KvExport> kv = std::move(it->second.kv);
  Erase(it);
  return kv;
}

bool KvLeaseTable::Release(const std::string& handle, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (tombstones_.size() >= kMaxTombstones) {
    // Bounded memory: forget the expired ones, or all of them when a flood
    // of releases outruns the lease period (a late push then leases until expiry).
    absl::erase_if(tombstones_, [now](const auto& t) { return t.second <= now; });
    if (tombstones_.size() >= kMaxTombstones) tombstones_.clear();
  }
  tombstones_[handle] = now + lease_;
  auto it = entries_.find(handle);
  if (it == entries_.end()) return false;
  if (!it->second.committed) {
    it->second.released = true;  // the push in flight is dropped at Commit
    return false;
  }
  Erase(it);
  return true;
}

int KvLeaseTable::ReapExpired(absl::Time now) {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (it->second.committed && it->second.expiry <= now) {
      Erase(it);
      ++n;
    }
    it = next;
  }
  num_expired_ += n;
  absl::erase_if(tombstones_, [now](const auto& t) { return t.second <= now; });
  return n;
}

void KvLeaseTable::StartReaper(absl::Duration period) {
  reaper_ = std::thread([this, period] {
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      cv_.WaitWithTimeout(&mu_, period);
      if (stop_) break;
      mu_.Unlock();
      ReapExpired();
      mu_.Lock();
    }
  });
}

KvLeaseStats KvLeaseTable::Stats() const {
  absl::MutexLock lock(&mu_);
  KvLeaseStats s;
  s.num_bytes = held_bytes_;
  s.num_expired = num_expired_;
  for (const auto& [handle, e] : entries_) {
    if (e.committed) {
      ++s.num_leases;
      s.num_tokens += e.kv != nullptr ? e.kv->num_tokens() : 0;
    } else {
      ++s.num_reserved;
    }
  }
  return s;
}

int64_t KvLeaseTable::num_leased_blocks() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [handle, e] : entries_) {
    if (e.committed && e.kv != nullptr) n += (e.kv->num_tokens() + block_size_ - 1) / block_size_;
  }
  return n;
}

absl::Status ValidateKvHeader(const tandem::v1::KvTransferHeader& h,
                              const tandem::v1::KvCompatibility& ours, int64_t bytes_per_token,
                              int64_t max_tokens, int64_t vocab_size) {
  TANDEM_RETURN_IF_ERROR(services::CheckCompat(ours, h.compat()));
  if (h.kv_handle().empty()) return absl::InvalidArgumentError("kv_handle is empty");
  if (h.kv_handle().size() > 256) return absl::InvalidArgumentError("kv_handle is over 256 bytes");
  if (h.num_tokens() < 1 || h.num_tokens() > max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_tokens ", h.num_tokens(), " outside [1, ", max_tokens, "]"));
  }
  if (h.bytes_per_token() != bytes_per_token) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes_per_token ", h.bytes_per_token(), " != ", bytes_per_token));
  }
  if (h.token_ids_size() != h.num_tokens()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_ids has ", h.token_ids_size(), " ids for num_tokens ", h.num_tokens()));
  }
  for (int32_t id : h.token_ids()) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token_ids: id ", id, " outside vocabulary"));
    }
  }
  if (h.total_bytes() != int64_t{h.num_tokens()} * bytes_per_token) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_bytes ", h.total_bytes(), " != num_tokens x bytes_per_token"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::transfer
