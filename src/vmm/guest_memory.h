// vmm/guest_memory.h: the guest's RAM, one anonymous mapping registered as KVM memory slot 0.
//
// Guest-physical address 0 is the first byte of the mapping. Devices reach guest memory (DMA)
// only through Translate, which refuses ranges outside RAM instead of touching host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "exitscope/status.h"

namespace exitscope::vmm {

class GuestMemory {
 public:
  // Maps `size` bytes (rounded up to 2 MiB) of zeroed anonymous memory.
  static Result<GuestMemory> Create(uint64_t size);
  GuestMemory() = default;
  ~GuestMemory();
  GuestMemory(GuestMemory&& o) noexcept;
  GuestMemory& operator=(GuestMemory&& o) noexcept;
  GuestMemory(const GuestMemory&) = delete;
  GuestMemory& operator=(const GuestMemory&) = delete;

  uint8_t* host() const noexcept { return host_; }
  uint64_t size() const noexcept { return size_; }

  // Host pointer to [gpa, gpa + len), or nullptr when any byte is outside RAM.
  uint8_t* Translate(uint64_t gpa, uint64_t len) const noexcept {
    if (gpa > size_ || len > size_ - gpa) return nullptr;
    return host_ + gpa;
  }
  // Bounds-checked copies; false when the range is outside RAM.
  bool Write(uint64_t gpa, const void* src, uint64_t len) noexcept {
    uint8_t* p = Translate(gpa, len);
    if (p == nullptr) return false;
    std::memcpy(p, src, len);
    return true;
  }
  bool Read(uint64_t gpa, void* dst, uint64_t len) const noexcept {
    const uint8_t* p = Translate(gpa, len);
    if (p == nullptr) return false;
    std::memcpy(dst, p, len);
    return true;
  }
  template <typename T>
  bool WriteObj(uint64_t gpa, const T& v) noexcept {
    return Write(gpa, &v, sizeof(T));
  }
  template <typename T>
  bool ReadObj(uint64_t gpa, T* v) const noexcept {
    return Read(gpa, v, sizeof(T));
  }

 private:
  uint8_t* host_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace exitscope::vmm
