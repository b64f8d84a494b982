// sources/kvm_dat_pages.h: packs raw trace records into ring-buffer pages, laid out as the
// kernel writes them (events/header_page: u64 timestamp, u64 commit, data; each event a
// 32-bit header type_len:5 | time_delta:27, little endian, then its data padded to 4 bytes;
// deltas of 2^27 or more get a TIME_EXTEND event first).
//
// Used to build .dat files from records laid out by real format files (the benchmark's large
// traces, tests of the .dat readers), written with TraceDatWriter (tracefs_dat.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

namespace exitscope::sources {

class RingPageWriter {
 public:
  // `flush` receives each full page (page_size bytes).
  explicit RingPageWriter(std::function<void(const std::vector<uint8_t>&)> flush,
                          size_t page_size = 4096)
      : flush_(std::move(flush)), page_(page_size, 0) {}

  // Appends one record (its raw bytes, common fields first) at time `ts` (not decreasing).
  // Records up to 112 bytes (type_len <= 28), as every kvm event is.
  void Add(uint64_t ts, const std::vector<uint8_t>& rec) {
    const size_t padded = (rec.size() + 3) & ~size_t{3};
    if (!TryAdd(ts, rec, padded)) {
      Flush();
      TryAdd(ts, rec, padded);
    }
  }
  // Emits the current page if it holds anything.
  void Flush() {
    if (pos_ == kData) return;
    const uint64_t commit = pos_ - kData;
    std::memcpy(page_.data() + 8, &commit, 8);
    flush_(page_);
    std::fill(page_.begin(), page_.end(), 0);
    pos_ = kData;
  }

 private:
  static constexpr size_t kData = 16;
  bool TryAdd(uint64_t ts, const std::vector<uint8_t>& rec, size_t padded) {
    if (pos_ + 4 + padded + 8 > page_.size()) return false;
    uint64_t delta = 0;
    if (pos_ == kData) {
      std::memcpy(page_.data(), &ts, 8);
    } else {
      delta = ts - last_;
    }
    if (delta >= (uint64_t{1} << 27)) {  // TIME_EXTEND (type_len 30)
      const uint32_t hdr = 30u | static_cast<uint32_t>((delta & ((1u << 27) - 1)) << 5);
      const uint32_t hi = static_cast<uint32_t>(delta >> 27);
      std::memcpy(page_.data() + pos_, &hdr, 4);
      std::memcpy(page_.data() + pos_ + 4, &hi, 4);
      pos_ += 8;
      delta = 0;
    }
    const uint32_t hdr = static_cast<uint32_t>(padded / 4) | static_cast<uint32_t>(delta << 5);
    std::memcpy(page_.data() + pos_, &hdr, 4);
    std::memcpy(page_.data() + pos_ + 4, rec.data(), rec.size());
    pos_ += 4 + padded;
    last_ = ts;
    return true;
  }
  std::function<void(const std::vector<uint8_t>&)> flush_;
  std::vector<uint8_t> page_;
  size_t pos_ = kData;
  uint64_t last_ = 0;
};

}  // namespace exitscope::sources
