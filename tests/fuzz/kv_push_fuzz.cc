// Fuzzes the KV handoff as a decode worker sees it: a PushKv stream of
// KvChunk messages (first a header, then data) from an untrusted prefill
// worker, through the same KvPushReceiver and KvLeaseTable the RPC uses.
// Input: [flag byte][u16 little-endian length][KvChunk bytes]... (flag bit 0
// clear: the header's compat is replaced by this worker's own). Whatever
// arrives: no crash, no reservation left behind a failed push, and a
// committed handoff is a valid KvExport that can be claimed once, after
// which the table holds nothing.
#include <cstdint>
#include <string>
#include <string_view>

#include "services/common/compat.h"
#include "services/transfer/kv_lease_table.h"
#include "services/transfer/kv_push_receiver.h"

namespace {

using tandem::transfer::KvLeaseTable;
using tandem::transfer::KvPushLimits;
using tandem::transfer::KvPushReceiver;

KvPushLimits Limits() {
  KvPushLimits l;
  l.num_layers = 2;
  l.num_kv_heads = 1;
  l.head_dim = 4;
  l.bytes_per_token = 2 * l.num_layers * l.num_kv_heads * l.head_dim * 4;
  l.max_tokens = 64;
  l.vocab_size = 100;
  l.max_chunk_bytes = 256;
  l.compat.set_model_name("fuzz");
  l.compat.set_model_fingerprint(42);
  l.compat.set_kv_dtype("f32");
  l.compat.set_block_size(16);
  l.compat.set_num_layers(2);
  l.compat.set_num_kv_heads(1);
  l.compat.set_head_dim(4);
  l.compat.set_hash(tandem::services::CompatHash(l.compat));
  return l;
}

void CheckEmpty(const KvLeaseTable& leases) {
  const auto s = leases.Stats();
  if (s.num_leases != 0 || s.num_reserved != 0 || s.num_bytes != 0) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const KvPushLimits limits = Limits();
  KvLeaseTable leases(absl::Seconds(30), 16);
  std::string handle;
  bool committed = false;
  {
    KvPushReceiver receiver(&leases, limits);
    if (size == 0) return 0;
    size_t pos = 1;
    bool reserved = false, failed = false;
    while (pos + 2 <= size && !failed) {
      const size_t len = data[pos] | (data[pos + 1] << 8);
      pos += 2;
      const size_t n = std::min(len, size - pos);
      tandem::v1::KvChunk chunk;
      const bool parsed = chunk.ParseFromArray(data + pos, static_cast<int>(n));
      pos += n;
      if (!parsed) return 0;
      if (!reserved) {
        // The RPC refuses a first message that is not a header.
        if (!chunk.has_header()) return 0;
        // Flag bit 0 clear: this worker's compat (its hash is hard for the
        // fuzzer to hit), so the size and token checks and the data path are
        // reached; set: the compat check itself.
        if ((data[0] & 1) == 0) *chunk.mutable_header()->mutable_compat() = limits.compat;
        if (!receiver.Validate(chunk.header()).ok()) return 0;
        handle = chunk.header().kv_handle();
        if (!receiver.Reserve(/*capacity_bytes=*/1 << 20).ok()) return 0;
        reserved = true;
        continue;
      }
      if (chunk.part_case() != tandem::v1::KvChunk::kData) break;  // the RPC ends here
      failed = !receiver.AddData(chunk.data()).ok();
    }
    if (!reserved) return 0;
    if (failed) {
      CheckEmpty(leases);  // a failed chunk aborted the reservation
      return 0;
    }
    auto bytes = receiver.Commit();
    committed = bytes.ok();
    if (!committed) CheckEmpty(leases);
  }  // the receiver's destructor must not touch a committed lease
  if (!committed) {
    CheckEmpty(leases);
    return 0;
  }
  auto kv = leases.Claim(handle);
  if (!kv.ok() || !(*kv)->Validate().ok()) __builtin_trap();
  if (leases.Claim(handle).ok()) __builtin_trap();  // one-shot
  CheckEmpty(leases);
  return 0;
}
