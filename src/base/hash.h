// base/hash.h: the one integer mixer, splitmix64's finalizer (Steele, Lea and Flood, "Fast
// splittable pseudorandom number generators", OOPSLA 2014): a bijection on 64 bits whose
// every output bit depends on every input bit. Hash tables keyed by addresses, ids or times
// use it to spread keys that differ only in a few low or high bits. Not public API.
#pragma once

#include <cstdint>

namespace exitscope::base {

// The golden-ratio increment of splitmix64's state.
inline constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ull;

// splitmix64's output for state x: Mix64(x) = finalize(x + gamma).
constexpr uint64_t SplitMix64(uint64_t x) noexcept {
  x += kGoldenGamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A hash of two words: order matters (HashPair(a, b) != HashPair(b, a) in general).
constexpr uint64_t HashPair(uint64_t a, uint64_t b) noexcept {
  return SplitMix64(SplitMix64(a) ^ b);
}

}  // namespace exitscope::base
