// sources/ring_page.h: the fast walk of one ring-buffer page (the kbuffer page format), for
// the .dat reader's fast path (tracecmd_dat.cc).
//
//   std::vector<RingEvent> events;                     // reused: no allocation per page
//   if (WalkRingPageFast(page, page_size, &events)) {  // every event, with its timestamp
//                                                      // (or appended: see the overload)
//     for (const RingEvent& e : events) use(page + e.offset, e.size, e.ts);
//   } else {
//     // not sure: the checked path (PageIsSane, then libtraceevent's kbuffer) reads it
//   }
//
// The page: u64 timestamp, u64 commit (flags in bits 30 and 31: events were lost, and their
// count is stored after the data), then `commit` bytes of events. Each event starts with a
// 32-bit header type_len:5 | time_delta:27. type_len 1..28: a record of type_len * 4 bytes;
// 30: TIME_EXTEND (the next 4 bytes are bits 27.. of the delta); 29: padding (its length in
// the next 4 bytes; past the commit's end it ends the page; with a non-zero delta it is a
// record the kernel discarded, which real captures hold). The timestamp of each record is
// the page's plus every delta before it and its own, the discarded records' included,
// exactly as kbuffer adds them.
//
// The walk accepts only what it is sure of and answers false for anything else, so that the
// checked path (which decides whether the page is corrupt) reads it instead:
//   - the layout: little-endian file on a little-endian host, 8-byte longs (data at 16);
//     the caller checks these once per file (FastRingPagesApply);
//   - type_len 0 (a long record, its size in a 32-bit field) and 31 (absolute time stamp,
//     read differently across libtraceevent versions);
//   - any header, extend word, padding length or record crossing the commit, a commit (plus
//     the stored lost-event count) not fitting the page.
// It never reads outside [page, page + page_size). Every page it accepts, PageIsSane accepts
// too, and kbuffer returns the same records with the same sizes and timestamps: tested on
// every committed .dat (tracecmd_fast_test.cc) and fuzzed (fuzz/dat_fuzzer.cc).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

namespace exitscope::sources {

// One record of a page: its data at page + offset, `size` bytes, at page clock `ts`.
struct RingEvent {
  uint32_t offset = 0;
  uint32_t size = 0;
  uint64_t ts = 0;
};

// True when pages of a file with this layout can take the fast walk at all.
constexpr bool FastRingPagesApply(bool file_big_endian, uint32_t long_size) noexcept {
  return !file_big_endian && std::endian::native == std::endian::little && long_size == 8;
}

// Walks one page (see above), appending its records to `out` with offsets from `page - base`
// (base: the page's offset in a larger buffer, 0 for offsets from the page). On false, what
// it appended is not useful (the caller drops it).
template <class Events>  // a std::vector<RingEvent>, whatever its allocator
inline bool WalkRingPageFast(const uint8_t* page, uint32_t page_size, uint32_t base, Events* out) {
  constexpr uint32_t kData = 16;
  if (page_size < kData) return false;
  uint64_t ts = 0, flags = 0;
  std::memcpy(&ts, page, 8);
  std::memcpy(&flags, page + 8, 8);
  const uint32_t size = static_cast<uint32_t>(flags) & ((1u << 27) - 1);
  const bool stored = (flags & (1ull << 31)) && (flags & (1ull << 30));
  if (uint64_t{kData} + size + (stored ? 8 : 0) > page_size) return false;
  const uint8_t* d = page + kData;
  uint32_t curr = 0;
  while (curr < size) {
    if (size - curr < 4) return false;
    uint32_t h;
    std::memcpy(&h, d + curr, 4);
    const uint32_t type_len = h & 31;
    const uint32_t delta = h >> 5;
    if (type_len >= 1 && type_len <= 28) {
      const uint32_t len = type_len * 4;
      if (len > size - curr - 4) return false;
      ts += delta;
      out->push_back({base + kData + curr + 4, len, ts});
      curr += 4 + len;
    } else if (type_len == 30) {  // TIME_EXTEND
      if (size - curr < 8) return false;
      uint32_t hi;
      std::memcpy(&hi, d + curr + 4, 4);
      ts += (uint64_t{hi} << 27) + delta;
      curr += 8;
    } else if (type_len == 29) {  // padding; with a delta, a discarded record
      if (size - curr < 8) return false;
      int32_t len;
      std::memcpy(&len, d + curr + 4, 4);
      if (len < 0) return false;
      ts += delta;  // as kbuffer does, for every header
      const uint64_t next = uint64_t{curr} + 4 + static_cast<uint32_t>(len);
      if (next >= size) break;
      curr = static_cast<uint32_t>(next);
    } else {
      return false;  // 0: long record; 31: absolute time stamp
    }
  }
  return true;
}

// The same with `out` cleared first and offsets from the page: on false it holds nothing
// useful.
inline bool WalkRingPageFast(const uint8_t* page, uint32_t page_size, std::vector<RingEvent>* out) {
  out->clear();
  return WalkRingPageFast(page, page_size, 0, out);
}

}  // namespace exitscope::sources
