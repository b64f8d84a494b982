// exitscope/watchdog.h: findings about exits and I/Os that take too long, noticed while they
// are still happening.
//
// The watchdog is a thread owned by the Recorder (Recorder::StartWatchdog). Every poll period
// it reads each vCPU's "current exit" slot (written by BeginExit, cleared by EndExit; the
// start time is atomic, so the watchdog sees an exit that never ends) and the table of I/Os in
// flight (fed by Recorder::IoSubmit / IoComplete). It reports:
//   - kStuckExitBegin: a vCPU has been inside one exit for at least stuck_exit_ns; reported
//     once per stall, while the vCPU is still inside;
//   - kStuckExitEnd: that exit ended; duration_ns is its total (emitted when the exit ends);
//   - kAgedIo: an I/O submitted at least io_age_ns ago has not completed (once per I/O).
// The SlowExitPolicy (recorder.h) adds kSlowExit for every exit whose duration reached its
// threshold, found when the exit ends.
// Each finding goes to the findings hook, the log sink (one line) and the findings ring kept
// by the Recorder (dumped).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "exitscope/exit_record.h"
#include "exitscope/export.h"
#include "exitscope/stack.h"

namespace exitscope {

// Stored in dumps; values stable.
enum class FindingType : uint8_t {
  kStuckExitBegin = 0,
  kStuckExitEnd = 1,
  kAgedIo = 2,
  kSlowExit = 3,
  // A later capture of a vCPU still stuck in the exit of an earlier kStuckExitBegin (at 4x and
  // 16x the threshold, StackOptions::captures_per_stall): `stack` holds what it does now.
  kStuckExitStack = 4,
};
// "stuck-exit", "stuck-exit-end", "aged-io", "slow-exit", "stuck-exit-stack".
std::string_view ToString(FindingType t) noexcept;

struct WatchdogOptions {
  uint64_t stuck_exit_ns = 20'000'000;  // report a vCPU inside one exit this long
  uint64_t io_age_ns = 20'000'000'000;  // report an I/O in flight this long
  uint64_t poll_ns = 0;                 // 0 = min(10 ms, stuck_exit_ns / 4), at least 1 ms
};

// Stack captures of stuck vCPU threads (stack.h, docs/stacks.md). Sizes are fixed at creation.
struct StackOptions {
  bool enabled = true;              // capture when the watchdog finds a vCPU stuck
  uint32_t max_frames = 48;         // user frames kept per capture (1..256); more are counted
  uint32_t captures_per_stall = 3;  // at 1x, 4x, 16x... the stuck threshold (1..8)
};

// One finding. `text` is the line as logged, e.g.
// "vCPU 4: stuck in exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008) for 1.02 s (still inside)".
struct FindingRecord {
  uint64_t time_ns = 0;  // CLOCK_MONOTONIC ns when found
  FindingType type = FindingType::kStuckExitBegin;
  uint32_t vcpu = 0;  // kStuckExit*/kSlowExit
  uint64_t duration_ns =
      0;  // so far (kStuckExitBegin, kAgedIo) or total (kStuckExitEnd, kSlowExit)
  ExitKind kind = ExitKind::kUnknown;
  AccessDir dir = AccessDir::kNone;
  uint8_t size = 0;
  uint64_t addr = 0;
  uint32_t device = kUnassigned;  // exit's device, or the I/O's device
  uint32_t reg = kNoRegister;
  uint32_t reg_element = 0;
  uint32_t reg_delta = 0;
  uint64_t io_id = 0;  // kAgedIo
  std::string text;
  // kStuckExitBegin / kStuckExitStack: what the stuck vCPU thread was doing (stack.h); empty
  // when no capture was made (switched off, no thread id yet, or another finding type).
  ThreadStack stack;
};

using FindingHook = std::function<void(const FindingRecord&)>;

// Fixed-capacity table of I/Os in flight (Recorder::IoSubmit / IoComplete), written by any
// thread without locks, scanned by the watchdog for I/Os in flight too long.
//
// Memory (all allocated at construction, capacity = 2^k >= kProbe):
//
//   slot[0] slot[1] ... slot[capacity-1]
//   slot = { state (atomic u64) | device | io_id | start_ticks }   (each field atomic)
//   state = (generation << 2) | phase
//
// An I/O lives in one of the kProbe slots after hash(device, io_id) (a window, wrapping). Each
// slot moves through four phases (0 kFree, 1 kClaimed, 2 kLive, 3 kReported); every arrow is
// one compare-and-swap on `state` (or, for the claimer, a release store), so exactly one
// thread makes each transition:
//
//   kFree --Submit: CAS, gen+1--> kClaimed --Submit: fields, then store--> kLive
//    ^ ^                                                                    |
//    | +-------------- Complete: CAS if device and io_id match -------------+
//    |                                                                      | CollectAged:
//    |                                                                      v CAS if old
//    +---------------- Complete: CAS if device and io_id match -------- kReported
//
// Owners: the submitting thread owns a slot between its claim and kLive (only it writes the
// fields, only in kClaimed); after that nobody writes them until the slot is free again. Any
// thread may complete (kLive/kReported -> kFree); only the watchdog reports
// (kLive -> kReported, once per I/O). The generation grows with every claim, so a
// compare-and-swap that read the state before the slot was freed and reused fails (no ABA);
// fields are stored with release and loaded with acquire, so a reader that sees a newer
// generation's field also fails its compare-and-swap.
//
// Lost tracking is counted, never silent: a submit whose window has no free slot is not
// tracked (`overflow`), a completion that finds no matching slot counts `untracked`.
class EXITSCOPE_EXPORT InflightIoTable {
 public:
  static constexpr int kProbe = 16;
  explicit InflightIoTable(uint32_t capacity);  // rounded up to a power of two, >= kProbe

  void Submit(uint32_t device, uint64_t io_id, uint64_t now_ticks) noexcept;
  void Complete(uint32_t device, uint64_t io_id) noexcept;

  struct Entry {
    uint32_t device;
    uint64_t io_id;
    uint64_t start_ticks;
    uint32_t slot;
  };
  // I/Os older than `min_start_ticks`, not yet reported; marks them reported.
  void CollectAged(uint64_t older_than_ticks, std::vector<Entry>* out) noexcept;
  uint64_t in_flight() const noexcept;
  uint64_t overflow() const noexcept { return overflow_.load(std::memory_order_relaxed); }
  uint64_t untracked() const noexcept { return untracked_.load(std::memory_order_relaxed); }
  uint32_t capacity() const noexcept { return mask_ + 1; }

 private:
  struct Slot {
    // (generation << 2) | phase; phase 0 free, 1 claimed, 2 live, 3 live+reported. The
    // generation grows with every claim, so a stale compare-and-swap always fails (rings.cc).
    std::atomic<uint64_t> state{0};
    std::atomic<uint32_t> device{0};
    std::atomic<uint64_t> io_id{0};
    std::atomic<uint64_t> start{0};
  };
  uint32_t mask_;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> overflow_{0};
  std::atomic<uint64_t> untracked_{0};
};

}  // namespace exitscope
