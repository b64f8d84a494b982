// ExitRing, FlightRecorder, DeviceEventRing and InflightIoTable: the lock-free stores.
#include <algorithm>

#include "base/hash.h"
#include "exitscope/device_events.h"
#include "exitscope/flight_recorder.h"
#include "exitscope/watchdog.h"

namespace exitscope {
namespace {

uint64_t RoundUpPow2(uint64_t v, uint64_t min) {
  v = std::max(v, min);
  uint64_t p = 1;
  while (p < v && p < (1ull << 62)) p <<= 1;
  return p;
}

// Copies slot `n` of a seqlocked ring; false when torn or not record n.
template <typename Slot, typename Record, int kWords>
bool ReadSlot(const Slot& s, uint64_t n, Record* out) {
  const uint64_t s1 = s.seq.load(std::memory_order_acquire);
  if (s1 != 2 * n + 2) return false;
  uint64_t w[kWords];
  for (int i = 0; i < kWords; ++i) w[i] = s.words[i].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (s.seq.load(std::memory_order_relaxed) != s1) return false;
  std::memcpy(static_cast<void*>(out), w, sizeof(Record));
  return true;
}

}  // namespace

// ---- ExitRing ----------------------------------------------------------------------------

ExitRing::ExitRing(uint64_t capacity)
    : mask_(RoundUpPow2(capacity, 2) - 1), slots_(new Slot[mask_ + 1]) {
  for (uint64_t i = 0; i <= mask_; ++i) {
    for (auto& w : slots_[i].words) w.store(0, std::memory_order_relaxed);
  }
}

// The per-slot seqlock of ReadSlot, without branches on the copy: each slot is copied to
// out[k] and k advances only if both loads of seq saw record n complete, so a torn or
// overwritten copy is simply overwritten by the next one. On x86-64 the acquire load and
// fence are plain loads and a compiler barrier: the loop runs at memory speed.
uint64_t ExitRing::CopyRange(uint64_t from, uint64_t to, ExitRecord* out) const noexcept {
  const Slot* const slots = slots_.get();
  const uint64_t mask = mask_;
  auto* const dst = reinterpret_cast<unsigned char*>(out);
  uint64_t k = 0;
  for (uint64_t n = from; n < to; ++n) {
    const Slot& s = slots[n & mask];
    const uint64_t s1 = s.seq.load(std::memory_order_acquire);
    // Each word stored where it belongs, one statement per word (GCC does not unroll a loop
    // of atomic loads, and a copy through the stack stalls on store forwarding).
    unsigned char* const o = dst + k * sizeof(ExitRecord);
    static_assert(kWords == 7);
    const uint64_t w0 = s.words[0].load(std::memory_order_relaxed);
    const uint64_t w1 = s.words[1].load(std::memory_order_relaxed);
    const uint64_t w2 = s.words[2].load(std::memory_order_relaxed);
    const uint64_t w3 = s.words[3].load(std::memory_order_relaxed);
    const uint64_t w4 = s.words[4].load(std::memory_order_relaxed);
    const uint64_t w5 = s.words[5].load(std::memory_order_relaxed);
    const uint64_t w6 = s.words[6].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    const uint64_t s2 = s.seq.load(std::memory_order_relaxed);
    std::memcpy(o, &w0, 8);
    std::memcpy(o + 8, &w1, 8);
    std::memcpy(o + 16, &w2, 8);
    std::memcpy(o + 24, &w3, 8);
    std::memcpy(o + 32, &w4, 8);
    std::memcpy(o + 40, &w5, 8);
    std::memcpy(o + 48, &w6, 8);
    k += (s1 == 2 * n + 2) & (s2 == s1);
  }
  return k;
}

uint64_t ExitRing::FindStart(uint64_t from, uint64_t to, uint64_t start_ticks) const noexcept {
  const uint64_t cap = mask_ + 1;
  for (uint64_t n = std::max(from, to > cap ? to - cap : 0); n < to; ++n) {
    const Slot& s = slots_[n & mask_];
    const uint64_t s1 = s.seq.load(std::memory_order_acquire);
    const uint64_t start = s.words[0].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != s1 || s1 != 2 * n + 2) continue;  // torn
    if (start == start_ticks) return n;
    if (start > start_ticks) break;  // a vCPU's exits are recorded in start order
  }
  return to;
}

uint64_t ExitRing::SnapshotNewest(uint64_t max, std::vector<ExitRecord>* out) const {
  const uint64_t head = head_.load(std::memory_order_acquire);
  const uint64_t first = FirstWanted(head, max);
  const size_t base = out->size();
  out->resize(base + (head - first));
  const uint64_t got = CopyRange(first, head, out->data() + base);
  out->resize(base + got);
  const uint64_t skipped = (head - first) - got;
  if (skipped != 0) skipped_.fetch_add(skipped, std::memory_order_relaxed);
  return skipped;
}

uint64_t ExitRing::Snapshot(std::vector<ExitRecord>* out) const {
  return SnapshotNewest(0, out);
}

RingCounters ExitRing::counters() const noexcept {
  RingCounters c;
  c.capacity = mask_ + 1;
  c.written = head_.load(std::memory_order_acquire);
  c.overwritten = c.written > c.capacity ? c.written - c.capacity : 0;
  c.skipped = skipped_.load(std::memory_order_relaxed);
  return c;
}

FlightRecorder::FlightRecorder(uint32_t num_vcpus, uint64_t events_per_vcpu) {
  rings_.reserve(num_vcpus);
  for (uint32_t i = 0; i < num_vcpus; ++i)
    rings_.push_back(std::make_unique<ExitRing>(events_per_vcpu));
}

// ---- DeviceEventRing ---------------------------------------------------------------------

std::string_view ToString(DeviceEventType t) noexcept {
  switch (t) {
    case DeviceEventType::kIoSubmit:
      return "io-submit";
    case DeviceEventType::kIoComplete:
      return "io-complete";
    case DeviceEventType::kQueueFull:
      return "queue-full";
    case DeviceEventType::kBackendError:
      return "backend-error";
    case DeviceEventType::kNote:
      return "note";
  }
  return "unknown";
}

DeviceEventRing::DeviceEventRing(uint64_t capacity)
    : mask_(RoundUpPow2(capacity, 2) - 1), slots_(new Slot[mask_ + 1]) {
  for (uint64_t i = 0; i <= mask_; ++i) {
    for (auto& w : slots_[i].words) w.store(0, std::memory_order_relaxed);
  }
}

uint64_t DeviceEventRing::Snapshot(std::vector<DeviceEventRecord>* out) const {
  const uint64_t head = head_.load(std::memory_order_acquire);
  const uint64_t cap = mask_ + 1;
  const uint64_t first = head > cap ? head - cap : 0;
  uint64_t skipped = 0;
  for (uint64_t n = first; n < head; ++n) {
    DeviceEventRecord r;
    if (ReadSlot<Slot, DeviceEventRecord, kWords>(slots_[n & mask_], n, &r)) {
      out->push_back(r);
    } else {
      ++skipped;
    }
  }
  if (skipped != 0) skipped_.fetch_add(skipped, std::memory_order_relaxed);
  return skipped;
}

DeviceEventCounters DeviceEventRing::counters() const noexcept {
  DeviceEventCounters c;
  c.capacity = mask_ + 1;
  c.written = head_.load(std::memory_order_acquire);
  c.overwritten = c.written > c.capacity ? c.written - c.capacity : 0;
  c.dropped = dropped_.load(std::memory_order_relaxed);
  c.skipped = skipped_.load(std::memory_order_relaxed);
  return c;
}

// ---- InflightIoTable ---------------------------------------------------------------------

std::string_view ToString(FindingType t) noexcept {
  switch (t) {
    case FindingType::kStuckExitBegin:
      return "stuck-exit";
    case FindingType::kStuckExitEnd:
      return "stuck-exit-end";
    case FindingType::kAgedIo:
      return "aged-io";
    case FindingType::kSlowExit:
      return "slow-exit";
    case FindingType::kStuckExitStack:
      return "stuck-exit-stack";
  }
  return "unknown";
}

InflightIoTable::InflightIoTable(uint32_t capacity)
    : mask_(static_cast<uint32_t>(RoundUpPow2(capacity, kProbe) - 1)),
      slots_(new Slot[mask_ + 1]) {}

// Slot state word: (generation << 2) | phase. Every claim of a free slot bumps the generation,
// so a compare-and-swap that expects (g, phase) fails if the slot was freed and reused since
// the state was read (no ABA). Fields are written only in phase kClaimed, with release stores,
// and read with acquire loads: a reader that sees a field of a newer generation therefore
// also sees that generation's claim, and its compare-and-swap fails.
namespace {
constexpr uint64_t kFree = 0, kClaimed = 1, kLive = 2, kReported = 3;
constexpr uint64_t Phase(uint64_t st) {
  return st & 3;
}
constexpr uint64_t WithPhase(uint64_t st, uint64_t phase) {
  return (st & ~uint64_t{3}) | phase;
}
}  // namespace

void InflightIoTable::Submit(uint32_t device, uint64_t io_id, uint64_t now_ticks) noexcept {
  const uint64_t h = base::SplitMix64(io_id ^ (static_cast<uint64_t>(device) << 40) ^ device);
  for (int i = 0; i < kProbe; ++i) {
    Slot& s = slots_[(h + static_cast<uint64_t>(i)) & mask_];
    uint64_t st = s.state.load(std::memory_order_relaxed);
    if (Phase(st) != kFree) continue;
    const uint64_t claimed = ((st >> 2) + 1) << 2 | kClaimed;
    if (!s.state.compare_exchange_strong(st, claimed, std::memory_order_acquire)) continue;
    s.device.store(device, std::memory_order_release);
    s.io_id.store(io_id, std::memory_order_release);
    s.start.store(now_ticks, std::memory_order_release);
    s.state.store(WithPhase(claimed, kLive), std::memory_order_release);
    return;
  }
  overflow_.fetch_add(1, std::memory_order_relaxed);
}

void InflightIoTable::Complete(uint32_t device, uint64_t io_id) noexcept {
  const uint64_t h = base::SplitMix64(io_id ^ (static_cast<uint64_t>(device) << 40) ^ device);
  for (int i = 0; i < kProbe; ++i) {
    Slot& s = slots_[(h + static_cast<uint64_t>(i)) & mask_];
    uint64_t st = s.state.load(std::memory_order_acquire);
    while (Phase(st) == kLive || Phase(st) == kReported) {
      if (s.device.load(std::memory_order_acquire) != device ||
          s.io_id.load(std::memory_order_acquire) != io_id) {
        break;
      }
      if (s.state.compare_exchange_weak(st, WithPhase(st, kFree), std::memory_order_acq_rel)) {
        return;
      }
    }
  }
  untracked_.fetch_add(1, std::memory_order_relaxed);
}

void InflightIoTable::CollectAged(uint64_t older_than_ticks, std::vector<Entry>* out) noexcept {
  for (uint32_t i = 0; i <= mask_; ++i) {
    Slot& s = slots_[i];
    uint64_t st = s.state.load(std::memory_order_acquire);
    if (Phase(st) != kLive) continue;
    // Read the fields first, then claim the report: the compare-and-swap succeeds only if the
    // slot still holds the same generation, so the fields read belong to the I/O reported.
    const Entry e{s.device.load(std::memory_order_acquire), s.io_id.load(std::memory_order_acquire),
                  s.start.load(std::memory_order_acquire), i};
    if (e.start_ticks > older_than_ticks) continue;
    if (!s.state.compare_exchange_strong(st, WithPhase(st, kReported), std::memory_order_acq_rel)) {
      continue;  // completed or reused meanwhile: a later poll looks again
    }
    try {
      out->push_back(e);
    } catch (...) {
      return;
    }
  }
}

uint64_t InflightIoTable::in_flight() const noexcept {
  uint64_t n = 0;
  for (uint32_t i = 0; i <= mask_; ++i) {
    const uint64_t st = slots_[i].state.load(std::memory_order_relaxed);
    n += (Phase(st) == kLive || Phase(st) == kReported) ? 1 : 0;
  }
  return n;
}

}  // namespace exitscope
