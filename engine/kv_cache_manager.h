// Per-sequence block tables over a BlockPool, with prefix caching, fork and
// copy-on-write.
//
// A sequence's block table maps its token positions to KV blocks: position p
// lives in block table[p / block_size] at offset p % block_size, i.e. cache
// slot table[p / block_size] * block_size + p % block_size. The manager never
// sees KV itself: where a write would land in a block shared with another
// table (ref_count > 1, after Fork()), AllocateSlots() gives the sequence a
// fresh block and reports a BlockCopy the caller performs in KvCacheStorage
// (KvCacheStorage::CopyBlock) before running the step.
//
// Prefix caching: once a full block's tokens are computed (MarkComputed), the
// block is registered under its chained hash; a later sequence with the same
// leading tokens and extra key reuses it (FindCachedPrefix, AllocateNew).
// Counters count prompt tokens queried and hit, like vLLM.
//
// Thread safety: none; the engine thread owns it.
#ifndef TANDEM_ENGINE_KV_CACHE_MANAGER_H_
#define TANDEM_ENGINE_KV_CACHE_MANAGER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/block_hash.h"
#include "engine/block_pool.h"
#include "kernels/kv_dtype.h"

namespace tandem::engine {

using SeqId = int64_t;

struct KvCacheConfig {
  int32_t block_size = 16;
  int64_t num_blocks = 0;           // > 0: used as is
  int64_t memory_budget_bytes = 0;  // used when num_blocks == 0
  bool enable_prefix_caching = true;

  // InvalidArgument when block_size < 1 or neither size is positive.
  absl::Status Validate() const;
};

// KV bytes one token occupies: 2 (K and V) x layers x kv_heads x head_dim x
// bytes_per_element.
int64_t KvBytesPerToken(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim,
                        int64_t bytes_per_element);

// num_blocks from config (as is, or budget / (bytes_per_token * block_size)).
// InvalidArgument when the config is invalid or the budget holds no block.
absl::StatusOr<int64_t> NumBlocksFor(const KvCacheConfig& config, int64_t bytes_per_token);

// The start-up log line: "KV cache: f16, 23040 B/token, 1000 blocks x 16
// tokens = 16000 tokens (368.6 MB), prefix caching on".
std::string DescribeKvCapacity(int64_t bytes_per_token, int64_t num_blocks, int32_t block_size,
                               bool enable_prefix_caching,
                               kernels::KvDtype dtype = kernels::KvDtype::kF32);

// Copy block src's KV to block dst (all layers, K and V).
struct BlockCopy {
  int32_t src = kNoBlock;
  int32_t dst = kNoBlock;
  bool operator==(const BlockCopy&) const = default;
};

struct PrefixCacheStats {
  int64_t num_query_tokens = 0;  // tokens of sequences admitted by AllocateNew
  int64_t num_hit_tokens = 0;    // of those, tokens served from the cache
};

class KvCacheManager {
 public:
  // REQUIRES: num_blocks >= 1, block_size >= 1.
  KvCacheManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching);

  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  int32_t block_size() const { return pool_.block_size(); }
  int32_t num_blocks() const { return pool_.num_blocks(); }
  int32_t num_free_blocks() const { return pool_.num_free_blocks(); }
  bool enable_prefix_caching() const { return enable_prefix_caching_; }
  const BlockPool& pool() const { return pool_; }
  const PrefixCacheStats& prefix_cache_stats() const { return stats_; }
  // Blocks needed to hold num_tokens tokens.
  int64_t BlocksFor(int64_t num_tokens) const {
    return (num_tokens + block_size() - 1) / block_size();
  }

  // Leading tokens of `tokens` covered by cached full blocks under extra_key:
  // a multiple of block_size, and < tokens.size() (the last token is always
  // computed, to produce logits). 0 with prefix caching off. No side effects.
  int64_t FindCachedPrefix(absl::Span<const int32_t> tokens, uint64_t extra_key) const;

  // Starts tracking `seq`: takes the cached prefix blocks (num_cached_tokens
  // must equal FindCachedPrefix(tokens, extra_key), nothing changed since) and
  // allocates blocks so the sequence holds num_cached_tokens + num_new_tokens
  // tokens. All-or-nothing: false and no change when blocks are short.
  // Counts tokens.size() queried and num_cached_tokens hit on success.
  // REQUIRES: seq not tracked; num_new_tokens >= 1;
  // num_cached_tokens + num_new_tokens <= tokens.size().
  bool AllocateNew(SeqId seq, absl::Span<const int32_t> tokens, uint64_t extra_key,
                   int64_t num_cached_tokens, int64_t num_new_tokens);

  // Makes a tracked sequence hold num_computed_tokens + num_new_tokens
  // tokens, and makes every block it will write (positions [num_computed,
  // num_computed + num_new)) its own: a shared one is replaced by a fresh
  // block and {old, new} appended to *copies. All-or-nothing: false and no
  // change when blocks are short. REQUIRES: seq tracked.
  bool AllocateSlots(SeqId seq, int64_t num_computed_tokens, int64_t num_new_tokens,
                     std::vector<BlockCopy>* copies);

  // Registers the sequence's full blocks whose tokens are all computed
  // (positions < num_computed_tokens) in the prefix cache. `tokens` are the
  // sequence's tokens (prompt + output). No-op with prefix caching off.
  void MarkComputed(SeqId seq, absl::Span<const int32_t> tokens, int64_t num_computed_tokens);

  // `child` shares all of parent's blocks (ref counts +1). FailedPrecondition
  // when parent is not tracked or child is.
  absl::Status Fork(SeqId parent, SeqId child);

  // Releases the sequence's blocks (tail first). No-op when not tracked.
  void Free(SeqId seq);

  bool Contains(SeqId seq) const { return seqs_.contains(seq); }
  // Empty when not tracked.
  absl::Span<const int32_t> block_table(SeqId seq) const;
  // Cache slot of position `position`. REQUIRES: the table covers it.
  int64_t Slot(SeqId seq, int64_t position) const;
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }

  // Every invariant: pool integrity, ref_count == number of table entries
  // holding the block, no block twice in one table, free <=> unreferenced.
  // FailedPrecondition describing the first violation.
  absl::Status CheckIntegrity() const;

  // Test hook: hash function used for blocks cached from now on (force
  // collisions). Call before any MarkComputed.
  void SetHashFnForTesting(BlockHashFn fn) { hash_fn_ = fn; }

 private:
  struct SeqBlocks {
    std::vector<int32_t> table;
    uint64_t extra_key = 0;
    int64_t num_hashed_blocks = 0;  // leading blocks already hashed
    BlockHash last_hash = kRootBlockHash;
    BlockLink last_link;  // canonical block of the last hashed block
  };

  BlockPool pool_;
  bool enable_prefix_caching_;
  BlockHashFn hash_fn_ = &HashBlockTokens;
  absl::flat_hash_map<SeqId, SeqBlocks> seqs_;
  PrefixCacheStats stats_;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_KV_CACHE_MANAGER_H_
