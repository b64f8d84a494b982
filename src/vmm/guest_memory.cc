#include "vmm/guest_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <string>
#include <utility>

namespace exitscope::vmm {

Result<GuestMemory> GuestMemory::Create(uint64_t size) {
  constexpr uint64_t k2M = 2ull << 20;
  if (size == 0 || size > (64ull << 30))
    return Fail(ErrorCode::kInvalidArgument,
                "guest memory size " + std::to_string(size) + " out of range (1 B..64 GiB)");
  size = (size + k2M - 1) & ~(k2M - 1);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED)
    return Fail(ErrorCode::kIo, "mmap of " + std::to_string(size) +
                                    " bytes of guest memory failed: " + std::strerror(errno));
  GuestMemory m;
  m.host_ = static_cast<uint8_t*>(p);
  m.size_ = size;
  return m;
}

GuestMemory::~GuestMemory() {
  if (host_ != nullptr) munmap(host_, size_);
}

GuestMemory::GuestMemory(GuestMemory&& o) noexcept
    : host_(std::exchange(o.host_, nullptr)), size_(std::exchange(o.size_, 0)) {}

GuestMemory& GuestMemory::operator=(GuestMemory&& o) noexcept {
  if (this != &o) {
    if (host_ != nullptr) munmap(host_, size_);
    host_ = std::exchange(o.host_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

}  // namespace exitscope::vmm
