// A fixed pool of KV cache blocks with an LRU free list and a prefix cache.
//
// Vocabulary follows vLLM v1's block_pool. Each KvBlock is metadata only (no
// pointers, no device memory): the KV itself lives in KvCacheStorage at the
// block's id. A block is either held (ref_count > 0, by one or more block
// tables) or free (ref_count == 0, in the free list). The free list is an
// intrusive doubly linked list threaded through the blocks by index, so a
// cached free block that is hit again leaves it in O(1).
//
// Prefix caching is lazy: a full block registered with CacheBlock() keeps its
// hash after it is freed and stays findable by Lookup() until Allocate() pops
// it from the free list head for reuse, which drops the hash then. Free() of a
// block without a hash puts it at the head (reused first, it holds nothing
// worth keeping); a hashed block goes to the tail (least recently used last).
// Callers free a sequence's blocks in reverse order so the tail of a chain is
// evicted before its head.
//
// Collision guard: the pool stores the token ids of every cached block and a
// link (id, generation) to the block it was computed after; Lookup() returns a
// block only when hash, tokens and link all match. A block's generation
// changes each time it is reallocated, so a stale link never matches.
//
// Thread safety: none; the engine thread owns it.
#ifndef TANDEM_ENGINE_BLOCK_POOL_H_
#define TANDEM_ENGINE_BLOCK_POOL_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/block_hash.h"

namespace tandem::engine {

inline constexpr int32_t kNoBlock = -1;

// The block a cached block was computed after: (kNoBlock, 0) for block 0.
struct BlockLink {
  int32_t id = kNoBlock;
  uint32_t generation = 0;
  bool operator==(const BlockLink&) const = default;
};

struct KvBlock {
  int32_t id = kNoBlock;
  int32_t ref_count = 0;
  bool has_hash = false;    // in the hash map (a cached full block)
  BlockHash hash = 0;       // valid when has_hash
  uint32_t generation = 0;  // incremented by each Allocate() of this block
  BlockLink parent;         // valid when has_hash
  // Free list links (block ids); kNoBlock at the ends or when not free.
  int32_t prev_free = kNoBlock;
  int32_t next_free = kNoBlock;
  bool in_free_list = false;
};

class BlockPool {
 public:
  // REQUIRES: num_blocks >= 1, block_size >= 1. All blocks start free, in id
  // order.
  BlockPool(int32_t num_blocks, int32_t block_size);

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t block_size() const { return block_size_; }
  // Blocks with ref_count 0, cached or not (all of them can be allocated).
  int32_t num_free_blocks() const { return num_free_; }
  int32_t num_cached_blocks() const { return static_cast<int32_t>(hash_to_block_.size()); }
  const KvBlock& block(int32_t id) const { return blocks_[id]; }
  // Tokens a cached block was registered with. REQUIRES: block(id).has_hash.
  absl::Span<const int32_t> cached_tokens(int32_t id) const;

  // Pops the free list head, drops its hash (eviction), sets ref_count 1 and
  // bumps its generation. REQUIRES: num_free_blocks() > 0.
  int32_t Allocate();

  // The cached block for (hash, tokens, parent) or kNoBlock. Does not change
  // ref counts; call Touch() to take it.
  int32_t Lookup(BlockHash hash, absl::Span<const int32_t> tokens, const BlockLink& parent) const;

  // Takes a reference on a block; a free (cached) block leaves the free list.
  void Touch(int32_t id);

  // Drops a reference; at 0 the block joins the free list (see header comment).
  // REQUIRES: ref_count > 0.
  void Free(int32_t id);

  // Registers a held full block under `hash`. Returns false (and changes
  // nothing) when the hash is already mapped to some block: the first one
  // stays canonical. REQUIRES: ref_count > 0, !has_hash,
  // tokens.size() == block_size().
  bool CacheBlock(int32_t id, BlockHash hash, absl::Span<const int32_t> tokens,
                  const BlockLink& parent);

  // Drops every free block's hash (held blocks keep theirs).
  void ResetPrefixCache();

  // Free list from head (next allocated) to tail.
  std::vector<int32_t> FreeListOrder() const;

  // Pool-local invariants: list links and counts, free <=> ref_count 0,
  // hash map <=> has_hash. FailedPrecondition naming the first violation.
  absl::Status CheckIntegrity() const;

 private:
  void PushFront(int32_t id);
  void PushBack(int32_t id);
  void Unlink(int32_t id);
  void DropHash(int32_t id);

  int32_t block_size_;
  std::vector<KvBlock> blocks_;
  std::vector<int32_t> tokens_;  // [num_blocks, block_size], valid for cached blocks
  absl::flat_hash_map<BlockHash, int32_t> hash_to_block_;
  int32_t free_head_ = kNoBlock;
  int32_t free_tail_ = kNoBlock;
  int32_t num_free_ = 0;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_BLOCK_POOL_H_
