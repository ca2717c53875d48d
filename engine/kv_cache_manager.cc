#include "engine/kv_cache_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

namespace tandem::engine {

absl::Status KvCacheConfig::Validate() const {
  if (block_size < 1) return absl::InvalidArgumentError("block_size must be >= 1");
  if (num_blocks < 0) return absl::InvalidArgumentError("num_blocks must be >= 0");
  if (num_blocks == 0 && memory_budget_bytes <= 0) {
    return absl::InvalidArgumentError("either num_blocks or memory_budget_bytes must be positive");
  }
  if (num_blocks > INT32_MAX) return absl::InvalidArgumentError("num_blocks is too large");
  return absl::OkStatus();
}

int64_t KvBytesPerToken(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim,
                        int64_t bytes_per_element) {
  return 2 * num_layers * num_kv_heads * head_dim * bytes_per_element;
}

absl::StatusOr<int64_t> NumBlocksFor(const KvCacheConfig& config, int64_t bytes_per_token) {
  TANDEM_RETURN_IF_ERROR(config.Validate());
  if (config.num_blocks > 0) return config.num_blocks;
  if (bytes_per_token < 1) return absl::InvalidArgumentError("bytes_per_token must be >= 1");
  const int64_t block_bytes = bytes_per_token * config.block_size;
  const int64_t n = std::min<int64_t>(config.memory_budget_bytes / block_bytes, INT32_MAX);
  if (n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV memory budget of ", config.memory_budget_bytes,
                     " bytes holds no block of ", block_bytes, " bytes"));
  }
  return n;
}

std::string DescribeKvCapacity(int64_t bytes_per_token, int64_t num_blocks, int32_t block_size,
                               bool enable_prefix_caching, kernels::KvDtype dtype) {
  const int64_t tokens = num_blocks * block_size;
  return absl::StrFormat(
      "KV cache: %s, %d B/token, %d blocks x %d tokens = %d tokens (%.1f MB), "
      "prefix caching %s",
      kernels::KvDtypeName(dtype), bytes_per_token, num_blocks, block_size, tokens,
      static_cast<double>(tokens) * static_cast<double>(bytes_per_token) / 1e6,
      enable_prefix_caching ? "on" : "off");
}

namespace {

struct PrefixWalk {
  std::vector<int32_t> blocks;
  BlockHash last_hash = kRootBlockHash;
  BlockLink last_link;
};

// Longest chain of cached blocks matching tokens, at most max_blocks long.
PrefixWalk WalkPrefix(const BlockPool& pool, BlockHashFn hash_fn, absl::Span<const int32_t> tokens,
                      uint64_t extra_key, int64_t max_blocks) {
  PrefixWalk walk;
  const int32_t bs = pool.block_size();
  for (int64_t i = 0; i < max_blocks; ++i) {
    absl::Span<const int32_t> block_tokens = tokens.subspan(i * bs, bs);
    const BlockHash hash = hash_fn(walk.last_hash, block_tokens, extra_key);
    const int32_t id = pool.Lookup(hash, block_tokens, walk.last_link);
    if (id == kNoBlock) break;
    walk.blocks.push_back(id);
    walk.last_hash = hash;
    walk.last_link = BlockLink{id, pool.block(id).generation};
  }
  return walk;
}

}  // namespace

KvCacheManager::KvCacheManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching)
    : pool_(num_blocks, block_size), enable_prefix_caching_(enable_prefix_caching) {}

int64_t KvCacheManager::FindCachedPrefix(absl::Span<const int32_t> tokens,
                                         uint64_t extra_key) const {
  if (!enable_prefix_caching_ || tokens.empty()) return 0;
  // Never the whole sequence: its last token must run to produce logits.
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / block_size();
  return static_cast<int64_t>(
             WalkPrefix(pool_, hash_fn_, tokens, extra_key, max_blocks).blocks.size()) *
         block_size();
}

bool KvCacheManager::AllocateNew(SeqId seq, absl::Span<const int32_t> tokens, uint64_t extra_key,
                                 int64_t num_cached_tokens, int64_t num_new_tokens) {
  TANDEM_CHECK(!seqs_.contains(seq));
  TANDEM_CHECK(num_new_tokens >= 1 && num_cached_tokens % block_size() == 0);
  TANDEM_CHECK(num_cached_tokens + num_new_tokens <= static_cast<int64_t>(tokens.size()));
  const int64_t num_cached_blocks = num_cached_tokens / block_size();
  PrefixWalk walk;
  if (num_cached_blocks > 0) {
    TANDEM_CHECK(enable_prefix_caching_);
    walk = WalkPrefix(pool_, hash_fn_, tokens, extra_key, num_cached_blocks);
    TANDEM_CHECK(static_cast<int64_t>(walk.blocks.size()) == num_cached_blocks);
  }
  // Cached blocks that are free leave the free list when taken.
  int64_t needed = BlocksFor(num_cached_tokens + num_new_tokens) - num_cached_blocks;
  for (int32_t id : walk.blocks) needed += pool_.block(id).ref_count == 0 ? 1 : 0;
  if (needed > pool_.num_free_blocks()) return false;

  SeqBlocks& s = seqs_[seq];
  s.extra_key = extra_key;
  s.table.reserve(BlocksFor(tokens.size()));
  for (int32_t id : walk.blocks) {
    pool_.Touch(id);
    s.table.push_back(id);
  }
  while (static_cast<int64_t>(s.table.size()) < BlocksFor(num_cached_tokens + num_new_tokens)) {
    s.table.push_back(pool_.Allocate());
  }
  s.num_hashed_blocks = num_cached_blocks;
  s.last_hash = walk.last_hash;
  s.last_link = walk.last_link;
  stats_.num_query_tokens += static_cast<int64_t>(tokens.size());
  stats_.num_hit_tokens += num_cached_tokens;
  return true;
}

bool KvCacheManager::AllocateSlots(SeqId seq, int64_t num_computed_tokens, int64_t num_new_tokens,
                                   std::vector<BlockCopy>* copies) {
  auto it = seqs_.find(seq);
  TANDEM_CHECK(it != seqs_.end());
  SeqBlocks& s = it->second;
  TANDEM_CHECK(num_computed_tokens >= s.num_hashed_blocks * block_size());
  const int64_t total_blocks = BlocksFor(num_computed_tokens + num_new_tokens);
  const int64_t have = static_cast<int64_t>(s.table.size());
  const int64_t first_written = num_computed_tokens / block_size();
  const int64_t last_held = std::min(total_blocks, have);
  int64_t needed = std::max<int64_t>(0, total_blocks - have);
  for (int64_t b = first_written; b < last_held; ++b) {
    needed += pool_.block(s.table[b]).ref_count > 1 ? 1 : 0;
  }
  if (needed > pool_.num_free_blocks()) return false;

  for (int64_t b = first_written; b < last_held; ++b) {
    const int32_t src = s.table[b];
    if (pool_.block(src).ref_count <= 1) continue;
    const int32_t dst = pool_.Allocate();
    copies->push_back(BlockCopy{src, dst});
    pool_.Free(src);  // still held by the other table(s)
    s.table[b] = dst;
  }
  while (static_cast<int64_t>(s.table.size()) < total_blocks) s.table.push_back(pool_.Allocate());
  return true;
}

void KvCacheManager::MarkComputed(SeqId seq, absl::Span<const int32_t> tokens,
                                  int64_t num_computed_tokens) {
  if (!enable_prefix_caching_) return;
  auto it = seqs_.find(seq);
  TANDEM_CHECK(it != seqs_.end());
  SeqBlocks& s = it->second;
  TANDEM_CHECK(num_computed_tokens <= static_cast<int64_t>(tokens.size()));
  const int64_t full =
      std::min<int64_t>(num_computed_tokens / block_size(), static_cast<int64_t>(s.table.size()));
  for (int64_t i = s.num_hashed_blocks; i < full; ++i) {
    absl::Span<const int32_t> block_tokens = tokens.subspan(i * block_size(), block_size());
    const BlockHash hash = hash_fn_(s.last_hash, block_tokens, s.extra_key);
    const int32_t id = s.table[i];
    // Another block may already hold these tokens (computed twice
    // concurrently): it stays canonical and the chain continues from it.
    int32_t canonical = pool_.Lookup(hash, block_tokens, s.last_link);
    if (canonical == kNoBlock && !pool_.block(id).has_hash &&
        pool_.CacheBlock(id, hash, block_tokens, s.last_link)) {
      canonical = id;
    }
    if (canonical == kNoBlock) canonical = id;  // collision: uncached, its chain unreachable
    s.last_hash = hash;
    s.last_link = BlockLink{canonical, pool_.block(canonical).generation};
    s.num_hashed_blocks = i + 1;
  }
}

absl::Status KvCacheManager::Fork(SeqId parent, SeqId child) {
  auto it = seqs_.find(parent);
  if (it == seqs_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("fork: sequence ", parent, " not tracked"));
  }
  if (seqs_.contains(child)) {
    return absl::FailedPreconditionError(absl::StrCat("fork: sequence ", child, " exists"));
  }
  SeqBlocks copy = it->second;
  for (int32_t id : copy.table) pool_.Touch(id);
  seqs_.emplace(child, std::move(copy));
  return absl::OkStatus();
}

void KvCacheManager::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  const std::vector<int32_t>& table = it->second.table;
  // Tail first, so a chain's last blocks sit nearer the LRU head.
  for (auto b = table.rbegin(); b != table.rend(); ++b) pool_.Free(*b);
  seqs_.erase(it);
}

absl::Span<const int32_t> KvCacheManager::block_table(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {};
  return it->second.table;
}

int64_t KvCacheManager::Slot(SeqId seq, int64_t position) const {
  absl::Span<const int32_t> table = block_table(seq);
  const int64_t b = position / block_size();
  TANDEM_CHECK(position >= 0 && b < static_cast<int64_t>(table.size()));
  return int64_t{table[b]} * block_size() + position % block_size();
}

absl::Status KvCacheManager::CheckIntegrity() const {
  TANDEM_RETURN_IF_ERROR(pool_.CheckIntegrity());
  std::vector<int32_t> refs(pool_.num_blocks(), 0);
  std::vector<SeqId> last_seen(pool_.num_blocks(), -1);
  std::vector<bool> seen(pool_.num_blocks(), false);
  for (const auto& [seq, s] : seqs_) {
    if (s.num_hashed_blocks > static_cast<int64_t>(s.table.size())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence ", seq, " hashed ", s.num_hashed_blocks, " of ", s.table.size(), " blocks"));
    }
    for (int32_t id : s.table) {
      if (id < 0 || id >= pool_.num_blocks()) {
        return absl::FailedPreconditionError(
            absl::StrCat("sequence ", seq, " holds bad block ", id));
      }
      if (seen[id] && last_seen[id] == seq) {
        return absl::FailedPreconditionError(
            absl::StrCat("sequence ", seq, " holds block ", id, " twice"));
      }
      seen[id] = true;
      last_seen[id] = seq;
      ++refs[id];
    }
  }
  for (int32_t id = 0; id < pool_.num_blocks(); ++id) {
    if (pool_.block(id).ref_count != refs[id]) {
      return absl::FailedPreconditionError(absl::StrCat("block ", id, " ref_count ",
                                                        pool_.block(id).ref_count, " but held by ",
                                                        refs[id], " tables"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::engine
