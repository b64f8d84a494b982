// CRC-32 (IEEE, reflected 0xedb88320): PCLMULQDQ folding, slice-by-8, and the bytewise table.
//
// The folding follows "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
// Instruction" (Gopal, Ozturk et al., Intel, 2009): four 128-bit lanes fold 64 bytes per step
// with x^(512+-64) mod P, then fold to 128 bits, to 64, and a Barrett reduction gives the 32-bit
// remainder. The constants are those of that paper for the reflected IEEE polynomial (the same
// as Linux's crc32-pclmul and zlib's crc32_simd).
#include "base/crc32.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace exitscope::base {
namespace {

using Table = std::array<std::array<uint32_t, 256>, 8>;

constexpr Table MakeTables() {
  Table t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  }
  return t;
}
constexpr Table kTables = MakeTables();

// `state` is the inverted CRC (the register), as all the Update functions below.
uint32_t UpdateBytewise(uint32_t state, const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) state = kTables[0][(state ^ p[i]) & 0xff] ^ (state >> 8);
  return state;
}

uint32_t UpdateSlice8(uint32_t state, const unsigned char* p, size_t n) {
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);  // little-endian loads (x86-64, the only target)
    std::memcpy(&hi, p + 4, 4);
    lo ^= state;
    state = kTables[7][lo & 0xff] ^ kTables[6][(lo >> 8) & 0xff] ^ kTables[5][(lo >> 16) & 0xff] ^
            kTables[4][lo >> 24] ^ kTables[3][hi & 0xff] ^ kTables[2][(hi >> 8) & 0xff] ^
            kTables[1][(hi >> 16) & 0xff] ^ kTables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  return UpdateBytewise(state, p, n);
}

#if defined(__x86_64__)
#define EXITSCOPE_CLMUL __attribute__((target("pclmul,sse4.1")))

EXITSCOPE_CLMUL inline __m128i Load(const unsigned char* q) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
}

// acc * x^(k) folded onto `next`: (acc.lo * k.lo) ^ (acc.hi * k.hi) ^ next.
EXITSCOPE_CLMUL inline __m128i Fold(__m128i acc, __m128i k, __m128i next) {
  const __m128i lo = _mm_clmulepi64_si128(acc, k, 0x00);
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(acc, k, 0x11), next), lo);
}

// Folds `n` bytes (n >= 64, a multiple of 16) into the register `state`.
EXITSCOPE_CLMUL uint32_t UpdateClmul(uint32_t state, const unsigned char* p, size_t n) {
  alignas(16) static const uint64_t k1k2[] = {0x0154442bd4, 0x01c6e41596};  // x^(512+-32)
  alignas(16) static const uint64_t k3k4[] = {0x01751997d0, 0x00ccaa009e};  // x^(128+-32)
  alignas(16) static const uint64_t k5k0[] = {0x0163cd6124, 0x0000000000};  // x^64
  alignas(16) static const uint64_t poly[] = {0x01db710641, 0x01f7011641};  // P', mu
  __m128i x1 = Load(p), x2 = Load(p + 16), x3 = Load(p + 32), x4 = Load(p + 48);
  x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128(static_cast<int>(state)));
  __m128i k = _mm_load_si128(reinterpret_cast<const __m128i*>(k1k2));
  p += 64;
  n -= 64;
  while (n >= 64) {
    x1 = Fold(x1, k, Load(p));
    x2 = Fold(x2, k, Load(p + 16));
    x3 = Fold(x3, k, Load(p + 32));
    x4 = Fold(x4, k, Load(p + 48));
    p += 64;
    n -= 64;
  }
  // Four lanes into one, then any 16-byte blocks left.
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(k3k4));
  x1 = Fold(x1, k, x2);
  x1 = Fold(x1, k, x3);
  x1 = Fold(x1, k, x4);
  while (n >= 16) {
    x1 = Fold(x1, k, Load(p));
    p += 16;
    n -= 16;
  }
  // 128 -> 64 bits.
  const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
  x2 = _mm_clmulepi64_si128(x1, k, 0x10);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
  k = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(k5k0));
  x2 = _mm_srli_si128(x1, 4);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k, 0x00), x2);
  // Barrett reduction to 32 bits.
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(poly));
  x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k, 0x10);
  x2 = _mm_clmulepi64_si128(_mm_and_si128(x2, mask32), k, 0x00);
  x1 = _mm_xor_si128(x1, x2);
  return static_cast<uint32_t>(_mm_extract_epi32(x1, 1));
}
#undef EXITSCOPE_CLMUL

bool HasClmul() {
  static const bool has = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return has;
}
#endif

}  // namespace

uint32_t Crc32Extend(uint32_t crc, const void* data, size_t size) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t state = ~crc;
#if defined(__x86_64__)
  if (size >= 64 && HasClmul()) {
    const size_t folded = size & ~size_t{15};
    state = UpdateClmul(state, p, folded);
    p += folded;
    size -= folded;
  }
#endif
  return ~UpdateSlice8(state, p, size);
}

uint32_t Crc32ExtendBytewise(uint32_t crc, const void* data, size_t size) noexcept {
  return ~UpdateBytewise(~crc, static_cast<const unsigned char*>(data), size);
}

uint32_t Crc32ExtendSlice8(uint32_t crc, const void* data, size_t size) noexcept {
  return ~UpdateSlice8(~crc, static_cast<const unsigned char*>(data), size);
}

bool Crc32UsesClmul() noexcept {
#if defined(__x86_64__)
  return HasClmul();
#else
  return false;
#endif
}

namespace {
// Multiplication modulo the (reflected) polynomial: bit 31 is x^0 (zlib's multmodp).
uint32_t MultModP(uint32_t a, uint32_t b) noexcept {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if ((a & m) != 0) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) != 0 ? (b >> 1) ^ 0xedb88320u : b >> 1;
  }
  return p;
}
}  // namespace

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) noexcept {
  // x^(8 len_b) mod P by squaring: x2n holds x^(2^k) for the current bit k of 8 len_b.
  uint32_t x2n = 1u << 30;  // x^1
  uint32_t p = 1u << 31;    // x^0
  for (uint64_t n = len_b * 8; n != 0; n >>= 1) {
    if ((n & 1) != 0) p = MultModP(x2n, p);
    x2n = MultModP(x2n, x2n);
  }
  return MultModP(p, crc_a) ^ crc_b;
}

}  // namespace exitscope::base
