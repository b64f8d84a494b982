// exitscope/device_events.h: device-side events (I/O submitted / completed, queue full,
// backend error, notes) in one fixed-size ring any thread may write.
//
// Multi-producer, lock-free, no allocation. A producer takes a ticket n with one fetch_add on
// the head and claims slot n % capacity by moving its seq from an even value below 2n+1 to
// 2n+1 (CAS), writes the payload, then publishes seq = 2n+2. If the slot is still being
// written by an older producer (a ring lap ahead of a stalled thread) or a newer ticket has
// already claimed it, the event is dropped and counted (`dropped`), never blocked on.
// Readers use the same per-slot seqlock as ExitRing and count what they skip.
//
// Notes are short fixed-size text (kNoteBytes - 1 characters); longer text is truncated and
// the record flagged.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "exitscope/exit_record.h"
#include "exitscope/export.h"

namespace exitscope {

// Stored in dumps; values stable.
enum class DeviceEventType : uint8_t {
  kIoSubmit = 0,
  kIoComplete = 1,
  kQueueFull = 2,
  kBackendError = 3,
  kNote = 4,
};
// "io-submit", "io-complete", "queue-full", "backend-error", "note".
std::string_view ToString(DeviceEventType t) noexcept;

inline constexpr size_t kNoteBytes = 40;

struct DeviceEventRecord {
  uint64_t time_ticks = 0;
  uint64_t io_id = 0;  // I/O id (submit/complete), queue id (queue full), else 0
  int64_t status = 0;  // completion status, errno for backend errors
  uint32_t device = kUnassigned;
  DeviceEventType type = DeviceEventType::kNote;
  uint8_t note_len = 0;   // bytes used in note
  uint8_t truncated = 0;  // 1 when the note was cut to fit
  uint8_t reserved = 0;
  char note[kNoteBytes] = {};  // not NUL-terminated; note_len bytes

  std::string_view text() const noexcept {
    return {note, note_len < kNoteBytes ? note_len : kNoteBytes};
  }
  void SetNote(std::string_view s) noexcept {
    const size_t n = s.size() < kNoteBytes ? s.size() : kNoteBytes;
    if (n > 0) std::memcpy(note, s.data(), n);
    note_len = static_cast<uint8_t>(n);
    truncated = s.size() > kNoteBytes ? 1 : 0;
  }
};
static_assert(sizeof(DeviceEventRecord) == 72);

struct DeviceEventCounters {
  uint64_t capacity = 0;
  uint64_t written = 0;      // tickets taken (events attempted)
  uint64_t overwritten = 0;  // written - capacity when positive
  uint64_t dropped = 0;      // producers that lost their slot to a concurrent writer
  uint64_t skipped = 0;      // torn / overwritten while a snapshot copied them
};

class EXITSCOPE_EXPORT DeviceEventRing {
 public:
  explicit DeviceEventRing(uint64_t capacity);  // rounded up to a power of two
  DeviceEventRing(const DeviceEventRing&) = delete;
  DeviceEventRing& operator=(const DeviceEventRing&) = delete;

  // Any thread. noexcept, lock-free, no allocation.
  void Write(const DeviceEventRecord& r) noexcept {
    const uint64_t n = head_.fetch_add(1, std::memory_order_relaxed);
    Slot& s = slots_[n & mask_];
    uint64_t cur = s.seq.load(std::memory_order_relaxed);
    for (;;) {
      if ((cur & 1) != 0 || cur >= 2 * n + 1) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      if (s.seq.compare_exchange_weak(cur, 2 * n + 1, std::memory_order_relaxed)) break;
    }
    std::atomic_thread_fence(std::memory_order_release);
    uint64_t w[kWords];
    std::memcpy(w, &r, sizeof(r));
    for (int i = 0; i < kWords; ++i) s.words[i].store(w[i], std::memory_order_relaxed);
    s.seq.store(2 * n + 2, std::memory_order_release);
  }

  // Copies the events held, in ticket order. Returns records skipped.
  uint64_t Snapshot(std::vector<DeviceEventRecord>* out) const;
  DeviceEventCounters counters() const noexcept;
  uint64_t capacity() const noexcept { return mask_ + 1; }

 private:
  static constexpr int kWords = sizeof(DeviceEventRecord) / sizeof(uint64_t);
  struct Slot {
    std::atomic<uint64_t> seq{0};
    std::atomic<uint64_t> words[kWords];
  };
  static_assert(sizeof(DeviceEventRecord) % sizeof(uint64_t) == 0);

  uint64_t mask_;
  std::unique_ptr<Slot[]> slots_;
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint64_t> dropped_{0};
  mutable std::atomic<uint64_t> skipped_{0};
};

}  // namespace exitscope
