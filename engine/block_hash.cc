#include "engine/block_hash.h"

namespace tandem::engine {
namespace {

// SplitMix64 finalizer: a bijection with full avalanche.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

BlockHash HashBlockTokens(BlockHash parent, absl::Span<const int32_t> tokens, uint64_t extra_key) {
  // Sequential absorption (each step mixes the state), so token order matters
  // and the length is absorbed last to separate prefixes of one another.
  uint64_t h = Mix(parent ^ 0x9e3779b97f4a7c15ULL);
  h = Mix(h ^ Mix(extra_key + 0x632be59bd9b4e019ULL));
  for (int32_t t : tokens) {
    h = Mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ULL));
  }
  return Mix(h ^ static_cast<uint64_t>(tokens.size()));
}

uint64_t HashExtraKey(std::string_view text) {
  if (text.empty()) return 0;
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, then mixed
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return Mix(h) | 1;  // never 0, which means "no key"
}

}  // namespace tandem::engine
