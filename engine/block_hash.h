// Chained hashes of full KV blocks for prefix caching.
//
// The hash of block i of a sequence is H(hash of block i-1, the block_size
// token ids of block i, extra key), with kRootBlockHash as the parent of block
// 0. Equal hashes therefore name equal prefixes, up to 64-bit collisions;
// BlockPool guards against those by also comparing stored tokens and the
// parent block, so a collision costs a cache miss, never wrong KV.
//
// The extra key separates caches that must not share KV for equal tokens: a
// cache salt, an adapter id (HashExtraKey turns a string into one).
//
// Thread safety: pure functions.
#ifndef TANDEM_ENGINE_BLOCK_HASH_H_
#define TANDEM_ENGINE_BLOCK_HASH_H_

#include <cstdint>
#include <string_view>

#include "absl/types/span.h"

namespace tandem::engine {

using BlockHash = uint64_t;

inline constexpr BlockHash kRootBlockHash = 0x243f6a8885a308d3ULL;  // digits of pi

// H(parent, tokens, extra_key): 64-bit, every input bit affects every output bit.
BlockHash HashBlockTokens(BlockHash parent, absl::Span<const int32_t> tokens, uint64_t extra_key);

// A 64-bit key for a string (cache salt, adapter name); 0 for "".
uint64_t HashExtraKey(std::string_view text);

// Signature of HashBlockTokens; KvCacheManager takes another one in tests to
// force collisions.
using BlockHashFn = BlockHash (*)(BlockHash parent, absl::Span<const int32_t> tokens,
                                  uint64_t extra_key);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_BLOCK_HASH_H_
