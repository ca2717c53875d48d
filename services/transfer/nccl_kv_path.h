// The data path of the NCCL KV transport, shared by the sender
// (nccl_kv_transport.h), the receiver (nccl_receiver.h) and the one-rank
// loopback the single-GPU test runs:
//
//   sender:   PackKvBlocks -> pinned host staging -> CopyToDevice (stream)
//             -> GroupStart, one ncclSend per segment, GroupEnd -> WaitStream
//   receiver: GroupStart, one ncclRecv per segment, GroupEnd -> CopyToHost
//             (stream) -> WaitStream -> UnpackKvBlocks into the KvExport bytes
//
// Everything is on the pair's dedicated stream, so stream order makes the
// sends wait for the upload and the download wait for the receives.
//
// Thread safety: a NcclStaging is used by one thread at a time.
#ifndef TANDEM_SERVICES_TRANSFER_NCCL_KV_PATH_H_
#define TANDEM_SERVICES_TRANSFER_NCCL_KV_PATH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "services/transfer/kv_block_packing.h"
#include "services/transfer/nccl_ops.h"

namespace tandem::transfer {

// Ranks in a pair's two-rank communicator: the prefill worker sends, the
// decode worker receives.
inline constexpr int kSenderRank = 0;
inline constexpr int kReceiverRank = 1;

// A pinned host buffer and a device buffer of the same size, grown on demand
// (kept between transfers of a pair).
class NcclStaging {
 public:
  explicit NcclStaging(NcclOps* ops) : ops_(ops) {}
  ~NcclStaging();
  NcclStaging(const NcclStaging&) = delete;
  NcclStaging& operator=(const NcclStaging&) = delete;

  // Ensures both buffers hold at least `bytes`; ResourceExhausted when the
  // allocation fails.
  absl::Status Reserve(int64_t bytes);
  char* host() const { return host_; }
  void* device() const { return device_; }
  int64_t capacity() const { return capacity_; }

 private:
  void Free();
  NcclOps* ops_;
  char* host_ = nullptr;
  void* device_ = nullptr;
  int64_t capacity_ = 0;
};

// Packs `payload` (layout.payload_bytes() bytes) into staging.host() and
// enqueues the upload to staging.device(). REQUIRES: staging reserved.
absl::Status StageForSend(NcclOps& ops, const KvBlockLayout& layout, const char* payload,
                          NcclStaging& staging, NcclOps::Stream stream);
// One Send / Recv per segment; call between GroupStart and GroupEnd.
absl::Status EnqueueSends(NcclOps& ops, NcclOps::Comm comm, int peer, const NcclStaging& staging,
                          const std::vector<KvSegment>& segments, NcclOps::Stream stream);
absl::Status EnqueueRecvs(NcclOps& ops, NcclOps::Comm comm, int peer, NcclStaging& staging,
                          const std::vector<KvSegment>& segments, NcclOps::Stream stream);
// Enqueues the download of staging.device() to staging.host().
absl::Status EnqueueDownload(NcclOps& ops, const KvBlockLayout& layout, NcclStaging& staging,
                             NcclOps::Stream stream);

// Asked between the slices of a wait: a non-OK status ends the wait with that
// status (the caller then aborts the communicator). Empty: never interrupts.
using NcclInterrupt = std::function<absl::Status()>;
inline constexpr absl::Duration kNcclWaitSlice = absl::Milliseconds(20);

// ops.WaitStream in slices of kNcclWaitSlice, asking `interrupt` between
// them: OK once the stream drained, DeadlineExceeded at `deadline`, the
// interrupt's status, or the ops' error (Unavailable / Internal).
absl::Status WaitStreamInterruptible(NcclOps& ops, NcclOps::Comm comm, NcclOps::Stream stream,
                                     absl::Time deadline, const NcclInterrupt& interrupt);

// Runs the whole sender path (stage, grouped sends, wait) to `peer`; the
// wait ends early when `interrupt` says so (the request was cancelled).
absl::Status SendKvBlocks(NcclOps& ops, NcclOps::Comm comm, NcclOps::Stream stream, int peer,
                          const KvBlockLayout& layout, int64_t blocks_per_segment,
                          const char* payload, NcclStaging& staging, absl::Time deadline,
                          const NcclInterrupt& interrupt = {});
// Posts the receiver path (grouped receives + download) from `peer`; the
// caller then waits with ops.WaitStream and unpacks from staging.host().
absl::Status PostRecvKvBlocks(NcclOps& ops, NcclOps::Comm comm, NcclOps::Stream stream, int peer,
                              const KvBlockLayout& layout, int64_t blocks_per_segment,
                              NcclStaging& staging, absl::Time deadline);

// The GPU-resident form (NcclPushBegin.token_segments, docs/nccl.md): the
// token-major payload sent from where the executor gathered it, no staging.
// A segment: `bytes` bytes of whole tokens at `data` (sender) or at `offset`
// into the receiver's buffer.
struct TokenSegment {
  const char* data = nullptr;
  int64_t offset = 0;
  int64_t bytes = 0;
  int64_t tokens = 0;
};
inline constexpr int64_t kMaxTokenSegments = 1 << 16;
// The pieces (each whole tokens of bytes_per_token, in order) as segments of
// at most max_segment_bytes (at least one token each): a piece larger than
// that is split. offset runs over the concatenation.
std::vector<TokenSegment> SplitTokenSegments(
    const std::vector<std::pair<const char*, int64_t>>& pieces, int64_t bytes_per_token,
    int64_t max_segment_bytes);
// The receiver's check of a begin's token_segments: InvalidArgument unless
// there are 1 .. kMaxTokenSegments of them, each >= 1 token and at most
// kMaxSegmentBytes, summing to num_tokens. Returns them with offsets.
absl::StatusOr<std::vector<TokenSegment>> CheckTokenSegments(absl::Span<const int64_t> tokens,
                                                             int64_t num_tokens,
                                                             int64_t bytes_per_token);
// The same for one round of a streamed push: the segments sum to at most
// max_tokens (the tokens still to come).
absl::StatusOr<std::vector<TokenSegment>> CheckTokenSegmentsWithin(absl::Span<const int64_t> tokens,
                                                                   int64_t max_tokens,
                                                                   int64_t bytes_per_token);
int64_t SegmentTokens(const std::vector<TokenSegment>& segments);
// Sender: one grouped ncclSend per segment from segment.data, then the wait
// (interruptible, as SendKvBlocks).
absl::Status SendTokenSegments(NcclOps& ops, NcclOps::Comm comm, NcclOps::Stream stream, int peer,
                               const std::vector<TokenSegment>& segments, absl::Time deadline,
                               const NcclInterrupt& interrupt = {});
// Receiver: one grouped ncclRecv per segment into base + segment.offset
// (device memory of the ops); the caller waits with WaitStream.
absl::Status PostRecvTokenSegments(NcclOps& ops, NcclOps::Comm comm, NcclOps::Stream stream,
                                   int peer, char* base, const std::vector<TokenSegment>& segments,
                                   absl::Time deadline);

// One rank sending to itself: pack, upload, ONE group with the sends and the
// receives to rank `self`, download, unpack. Returns the received payload.
// This is the single-GPU test of the data path (NCCL refuses two ranks on
// one device); the two-rank path runs the same functions split across ranks.
absl::StatusOr<std::string> LoopbackKvBlocks(NcclOps& ops, NcclOps::Comm comm,
                                             NcclOps::Stream stream, int self,
                                             const KvBlockLayout& layout,
                                             int64_t blocks_per_segment, const char* payload,
                                             NcclStaging& send_staging, NcclStaging& recv_staging,
                                             absl::Time deadline);

}  // namespace tandem::transfer

#endif  // TANDEM_SERVICES_TRANSFER_NCCL_KV_PATH_H_
