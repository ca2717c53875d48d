#include "engine/block_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::engine {

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size)
    : block_size_(block_size),
      blocks_(num_blocks),
      tokens_(static_cast<size_t>(num_blocks) * block_size, 0) {
  TANDEM_CHECK(num_blocks >= 1 && block_size >= 1);
  for (int32_t i = 0; i < num_blocks; ++i) {
    blocks_[i].id = i;
    PushBack(i);
  }
}

absl::Span<const int32_t> BlockPool::cached_tokens(int32_t id) const {
  TANDEM_CHECK(blocks_[id].has_hash);
  return absl::MakeConstSpan(tokens_).subspan(static_cast<size_t>(id) * block_size_, block_size_);
}

void BlockPool::PushFront(int32_t id) {
  KvBlock& b = blocks_[id];
  b.prev_free = kNoBlock;
  b.next_free = free_head_;
  if (free_head_ != kNoBlock) blocks_[free_head_].prev_free = id;
  free_head_ = id;
  if (free_tail_ == kNoBlock) free_tail_ = id;
  b.in_free_list = true;
  ++num_free_;
}

void BlockPool::PushBack(int32_t id) {
  KvBlock& b = blocks_[id];
  b.next_free = kNoBlock;
  b.prev_free = free_tail_;
  if (free_tail_ != kNoBlock) blocks_[free_tail_].next_free = id;
  free_tail_ = id;
  if (free_head_ == kNoBlock) free_head_ = id;
  b.in_free_list = true;
  ++num_free_;
}

void BlockPool::Unlink(int32_t id) {
  KvBlock& b = blocks_[id];
  TANDEM_CHECK(b.in_free_list);
  if (b.prev_free != kNoBlock) {
    blocks_[b.prev_free].next_free = b.next_free;
  } else {
    free_head_ = b.next_free;
  }
  if (b.next_free != kNoBlock) {
    blocks_[b.next_free].prev_free = b.prev_free;
  } else {
    free_tail_ = b.prev_free;
  }
  b.prev_free = b.next_free = kNoBlock;
  b.in_free_list = false;
  --num_free_;
}

void BlockPool::DropHash(int32_t id) {
  KvBlock& b = blocks_[id];
  if (!b.has_hash) return;
  auto it = hash_to_block_.find(b.hash);
  TANDEM_CHECK(it != hash_to_block_.end() && it->second == id);
  hash_to_block_.erase(it);
  b.has_hash = false;
  b.hash = 0;
  b.parent = BlockLink{};
}

int32_t BlockPool::Allocate() {
  TANDEM_CHECK(free_head_ != kNoBlock);
  const int32_t id = free_head_;
  Unlink(id);
  DropHash(id);  // lazy eviction: the cached content dies only now
  KvBlock& b = blocks_[id];
  TANDEM_CHECK(b.ref_count == 0);
  b.ref_count = 1;
  ++b.generation;
  return id;
}

int32_t BlockPool::Lookup(BlockHash hash, absl::Span<const int32_t> tokens,
                          const BlockLink& parent) const {
  auto it = hash_to_block_.find(hash);
  if (it == hash_to_block_.end()) return kNoBlock;
  const int32_t id = it->second;
  // A 64-bit collision must cost a miss, never another prefix's KV.
  if (!(blocks_[id].parent == parent)) return kNoBlock;
  absl::Span<const int32_t> stored = cached_tokens(id);
  if (tokens.size() != stored.size() || !std::equal(tokens.begin(), tokens.end(), stored.begin())) {
    return kNoBlock;
  }
  return id;
}

void BlockPool::Touch(int32_t id) {
  KvBlock& b = blocks_[id];
  if (b.ref_count == 0) Unlink(id);
  ++b.ref_count;
}

void BlockPool::Free(int32_t id) {
  KvBlock& b = blocks_[id];
  TANDEM_CHECK(b.ref_count > 0);
  if (--b.ref_count > 0) return;
  if (b.has_hash) {
    PushBack(id);
  } else {
    PushFront(id);
  }
}

bool BlockPool::CacheBlock(int32_t id, BlockHash hash, absl::Span<const int32_t> tokens,
                           const BlockLink& parent) {
  KvBlock& b = blocks_[id];
  TANDEM_CHECK(b.ref_count > 0 && !b.has_hash);
  TANDEM_CHECK(static_cast<int32_t>(tokens.size()) == block_size_);
  if (!hash_to_block_.try_emplace(hash, id).second) return false;
  b.has_hash = true;
  b.hash = hash;
  b.parent = parent;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<size_t>(id) * block_size_);
  return true;
}

void BlockPool::ResetPrefixCache() {
  for (int32_t id = free_head_; id != kNoBlock; id = blocks_[id].next_free) DropHash(id);
}

std::vector<int32_t> BlockPool::FreeListOrder() const {
  std::vector<int32_t> order;
  order.reserve(num_free_);
  for (int32_t id = free_head_; id != kNoBlock; id = blocks_[id].next_free) order.push_back(id);
  return order;
}

absl::Status BlockPool::CheckIntegrity() const {
  const int32_t n = num_blocks();
  int32_t count = 0;
  int32_t prev = kNoBlock;
  for (int32_t id = free_head_; id != kNoBlock; id = blocks_[id].next_free) {
    if (id < 0 || id >= n)
      return absl::FailedPreconditionError(absl::StrCat("free list holds bad id ", id));
    if (++count > n) return absl::FailedPreconditionError("free list has a cycle");
    const KvBlock& b = blocks_[id];
    if (!b.in_free_list) {
      return absl::FailedPreconditionError(
          absl::StrCat("block ", id, " in free list not marked free"));
    }
    if (b.prev_free != prev) {
      return absl::FailedPreconditionError(
          absl::StrCat("block ", id, " prev link ", b.prev_free, " != ", prev));
    }
    prev = id;
  }
  if (prev != free_tail_) {
    return absl::FailedPreconditionError(absl::StrCat("free tail ", free_tail_, " != last ", prev));
  }
  if (count != num_free_) {
    return absl::FailedPreconditionError(
        absl::StrCat("free list has ", count, " blocks, count says ", num_free_));
  }
  int32_t num_hashed = 0;
  for (const KvBlock& b : blocks_) {
    if (b.ref_count < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("block ", b.id, " ref_count ", b.ref_count));
    }
    if (b.in_free_list != (b.ref_count == 0)) {
      return absl::FailedPreconditionError(absl::StrCat("block ", b.id, " ref_count ", b.ref_count,
                                                        " but in_free_list=", b.in_free_list));
    }
    if (!b.in_free_list && (b.prev_free != kNoBlock || b.next_free != kNoBlock)) {
      return absl::FailedPreconditionError(absl::StrCat("held block ", b.id, " has free links"));
    }
    if (b.has_hash) {
      ++num_hashed;
      auto it = hash_to_block_.find(b.hash);
      if (it == hash_to_block_.end() || it->second != b.id) {
        return absl::FailedPreconditionError(
            absl::StrCat("block ", b.id, " hash not mapped to it"));
      }
    }
  }
  for (const auto& [hash, id] : hash_to_block_) {
    if (id < 0 || id >= n || !blocks_[id].has_hash || blocks_[id].hash != hash) {
      return absl::FailedPreconditionError(
          absl::StrCat("hash map entry -> block ", id, " is stale"));
    }
  }
  if (num_hashed != static_cast<int32_t>(hash_to_block_.size())) {
    return absl::FailedPreconditionError("hash map size != hashed blocks");
  }
  return absl::OkStatus();
}

}  // namespace tandem::engine
