// base/huge_pages.h: an allocator for large buffers that are written as soon as they are
// allocated, on whole 2 MiB pages where the kernel gives them (transparent huge pages in
// madvise mode), so that filling a buffer costs one page fault instead of one per 4 KiB.
//
// Why: a fault on a fresh 4 KiB page costs about 15 us on a kvm-pvm guest (its page tables
// are the hypervisor's to update) and 0.2 us per 4 KiB on a huge page; docs/trace-files.md
// has the figures. A buffer below kHugeFrom bytes, or where the kernel has no huge pages,
// is ordinary memory: the allocator changes where the memory is, never what it holds.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <type_traits>
#include <vector>

namespace exitscope::base {

inline constexpr size_t kHugePage = size_t{2} << 20;
inline constexpr size_t kHugeFrom = size_t{64} << 10;  // smaller buffers: operator new

// `bytes` (>= kHugeFrom) rounded up to whole huge pages, on a huge page boundary; nullptr
// when the mapping fails.
inline void* MapHuge(size_t bytes) noexcept {
  const size_t len = (bytes + kHugePage - 1) & ~(kHugePage - 1);
  void* raw =
      mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + len + kHugePage;
  if (end > aligned + len) munmap(reinterpret_cast<void*>(aligned + len), end - aligned - len);
  madvise(reinterpret_cast<void*>(aligned), len, MADV_HUGEPAGE);  // a hint: may be refused
  return reinterpret_cast<void*>(aligned);
}

inline void UnmapHuge(void* p, size_t bytes) noexcept {
  munmap(p, (bytes + kHugePage - 1) & ~(kHugePage - 1));
}

template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() noexcept = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}  // NOLINT: rebinding converts

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugeFrom) return static_cast<T*>(::operator new(bytes));
    void* p = MapHuge(bytes);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugeFrom) {
      ::operator delete(p);
    } else {
      UnmapHuge(p, bytes);
    }
  }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

// Slots of one size carved from huge pages, taken and given back from any thread: for
// buffers of about one size that a program frees and allocates again and again (a reader's
// batches). Memory grows by a huge page at a time and is unmapped with the arena, which
// every slot must have been given back to first.
class SlotArena {
 public:
  // `slot_bytes` rounded up to whole 4 KiB pages (at least one).
  explicit SlotArena(size_t slot_bytes)
      : slot_((std::max<size_t>(slot_bytes, 1) + 4095) & ~size_t{4095}) {}
  ~SlotArena() {
    for (void* b : blocks_) UnmapHuge(b, Block());
  }
  SlotArena(const SlotArena&) = delete;
  SlotArena& operator=(const SlotArena&) = delete;

  size_t slot() const noexcept { return slot_; }
  void* Get() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) {
      auto* b = static_cast<uint8_t*>(MapHuge(Block()));
      if (b == nullptr) throw std::bad_alloc();
      blocks_.push_back(b);
      for (size_t at = Block(); at >= slot_; at -= slot_) free_.push_back(b + at - slot_);
    }
    void* p = free_.back();
    free_.pop_back();
    return p;
  }
  void Put(void* p) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(p);
  }

 private:
  size_t Block() const noexcept { return slot_ > kHugePage ? slot_ : kHugePage; }
  std::mutex mu_;
  size_t slot_;
  std::vector<void*> free_;
  std::vector<void*> blocks_;
};

// A buffer of at most the arena's slot comes from the arena; a larger one, or one with no
// arena (the default), from operator new.
template <class T>
struct SlotAllocator {
  using value_type = T;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  SlotArena* arena = nullptr;
  SlotAllocator() noexcept = default;
  explicit SlotAllocator(SlotArena* a) noexcept : arena(a) {}
  template <class U>
  SlotAllocator(const SlotAllocator<U>& o) noexcept : arena(o.arena) {}  // NOLINT: rebinding

  T* allocate(size_t n) {
    if (arena != nullptr && n * sizeof(T) <= arena->slot()) return static_cast<T*>(arena->Get());
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept {
    if (arena != nullptr && n * sizeof(T) <= arena->slot()) {
      arena->Put(p);
    } else {
      ::operator delete(p);
    }
  }
  template <class U>
  bool operator==(const SlotAllocator<U>& o) const noexcept {
    return arena == o.arena;
  }
};

}  // namespace exitscope::base
