// exitscope/flight_recorder.h: per-vCPU rings of ExitRecords, written without locks, read by
// concurrent snapshots.
//
// Memory layout (one ExitRing per vCPU, all memory allocated at creation):
//
//   ExitRing
//   +--------------+----------------------------------------------------------+
//   | head (atomic)|  slot[0]  slot[1]  ...  slot[capacity-1]   (capacity=2^k)  |
//   +--------------+----------------------------------------------------------+
//   slot = { seq (atomic u64) | 7 payload words (atomic u64, relaxed) } = 64 bytes
//
// The vCPU thread is the only writer of its ring. Record n goes to slot n % capacity:
//
//   seq = 2n+1 (odd: being written)  ->  payload stores  ->  seq = 2n+2 (complete)  -> head = n+1
//
// A reader copies slot n's payload between two loads of seq and keeps the copy only if both
// loads saw 2n+2 (a per-slot seqlock): anything else means the slot was being written or
// already overwritten by record n + capacity, and the record is skipped and counted. The
// writer never waits for readers, so readers never stall a vCPU; they can only lose records
// that were overwritten under them, and that loss is counted, never silent.
//
// Counters: written (records ever written), overwritten (written - capacity when positive:
// records the ring no longer holds), skipped (records a snapshot wanted but found torn or
// overwritten while copying; summed over snapshots).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "exitscope/exit_record.h"
#include "exitscope/export.h"
#include "exitscope/status.h"

namespace exitscope {

struct RingCounters {
  uint64_t capacity = 0;
  uint64_t written = 0;
  uint64_t overwritten = 0;
  uint64_t skipped = 0;
};

class EXITSCOPE_EXPORT ExitRing {
 public:
  // `capacity` is rounded up to a power of two (minimum 2).
  explicit ExitRing(uint64_t capacity);
  ExitRing(const ExitRing&) = delete;
  ExitRing& operator=(const ExitRing&) = delete;

  // Appends one record. Single writer only (one thread per ring at a time). noexcept, no
  // lock, no allocation, no syscall.
  void Write(const ExitRecord& r) noexcept {
    uint64_t w[kWords];
    std::memcpy(w, &r, sizeof(r));
    WriteWords(w);
  }

  // Write() for a record given as its 7 little-endian words (the layout of ExitRecord). On
  // Recorder::EndExit's path: inline, one statement per word (a loop of atomic stores is not
  // unrolled at -O2 and costs more than the stores).
  [[gnu::always_inline]] void WriteWords(
      const uint64_t (&w)[sizeof(ExitRecord) / sizeof(uint64_t)]) noexcept {
    static_assert(kWords == 7);
    const uint64_t n = head_.load(std::memory_order_relaxed);
    Slot& s = slots_[n & mask_];
    s.seq.store(2 * n + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    s.words[0].store(w[0], std::memory_order_relaxed);
    s.words[1].store(w[1], std::memory_order_relaxed);
    s.words[2].store(w[2], std::memory_order_relaxed);
    s.words[3].store(w[3], std::memory_order_relaxed);
    s.words[4].store(w[4], std::memory_order_relaxed);
    s.words[5].store(w[5], std::memory_order_relaxed);
    s.words[6].store(w[6], std::memory_order_relaxed);
    s.seq.store(2 * n + 2, std::memory_order_release);
    head_.store(n + 1, std::memory_order_release);
  }

  // Copies the records currently held, oldest first, into `out` (appended). Consistent per
  // record; safe concurrently with Write on another thread. Returns the number of records
  // skipped (torn or overwritten while copying), also added to skipped().
  uint64_t Snapshot(std::vector<ExitRecord>* out) const;

  // Copies at most the `max` newest records (oldest first). Same guarantees as Snapshot.
  uint64_t SnapshotNewest(uint64_t max, std::vector<ExitRecord>* out) const;

  // What one snapshot saw. `written` is the head it copied up to (records ever written at that
  // instant), `copied` the records it returned, `skipped` those it wanted but found torn or
  // overwritten while copying. With max == 0 (everything held):
  // written == copied + skipped + (written - capacity, when positive: the overwritten ones).
  struct SnapshotStats {
    uint64_t written = 0;
    uint64_t copied = 0;
    uint64_t skipped = 0;
  };

  // Snapshot for bulk readers (Recorder::Snapshot, dumps): the same records as
  // SnapshotNewest(max, ...), copied `chunk_len` at a time into the caller's `chunk` (small
  // enough to stay in cache), with consume(const ExitRecord* records, size_t n) called after
  // each chunk that holds any (n <= chunk_len). No allocation. Adds `skipped` to skipped().
  template <typename Consume>
  SnapshotStats SnapshotChunked(uint64_t max, ExitRecord* chunk, size_t chunk_len,
                                Consume&& consume) const {
    return SnapshotChunkedUpTo(head_.load(std::memory_order_acquire), max, chunk, chunk_len,
                               consume);
  }
  // SnapshotChunked as of an earlier head: the records before index `head` (a value written()
  // returned), as if the snapshot had been taken when the ring held exactly `head` records.
  template <typename Consume>
  SnapshotStats SnapshotChunkedUpTo(uint64_t head, uint64_t max, ExitRecord* chunk,
                                    size_t chunk_len, Consume&& consume) const {
    SnapshotStats st;
    st.written = head;
    for (uint64_t n = FirstWanted(st.written, max); n < st.written;) {
      const uint64_t end = st.written - n > chunk_len ? n + chunk_len : st.written;
      const uint64_t got = CopyRange(n, end, chunk);
      st.copied += got;
      st.skipped += (end - n) - got;
      if (got != 0) consume(static_cast<const ExitRecord*>(chunk), static_cast<size_t>(got));
      n = end;
    }
    if (st.skipped != 0) skipped_.fetch_add(st.skipped, std::memory_order_relaxed);
    return st;
  }
  uint64_t ReadFrom(uint64_t* next, std::vector<ExitRecord>* out) const;  // ring_read.cc

  // The index in [from, to) (to <= written()) of the record that started at `start_ticks` (an
  // exit a reader saw in progress, if it has ended and reached the ring since), else `to`.
  // Looks only at records still held, and stops at the first intact one that started later.
  uint64_t FindStart(uint64_t from, uint64_t to, uint64_t start_ticks) const noexcept;

  RingCounters counters() const noexcept;
  uint64_t capacity() const noexcept { return mask_ + 1; }
  uint64_t written() const noexcept { return head_.load(std::memory_order_acquire); }

 private:
  static constexpr int kWords = sizeof(ExitRecord) / sizeof(uint64_t);
  // Index of the oldest record a snapshot at `head` wants (the `max` newest; 0 = all held).
  uint64_t FirstWanted(uint64_t head, uint64_t max) const noexcept {
    const uint64_t cap = mask_ + 1;
    uint64_t first = head > cap ? head - cap : 0;
    if (max != 0 && head - first > max) first = head - max;
    return first;
  }
  // Copies the records with indices [from, to) that are intact (seqlock) into out[0, ...),
  // oldest first; returns how many. Does not touch skipped_.
  uint64_t CopyRange(uint64_t from, uint64_t to, ExitRecord* out) const noexcept;
  struct alignas(64) Slot {
    std::atomic<uint64_t> seq{0};
    std::atomic<uint64_t> words[kWords];
  };
  static_assert(sizeof(ExitRecord) % sizeof(uint64_t) == 0);
  static_assert(sizeof(Slot) == 64);

  uint64_t mask_;
  std::unique_ptr<Slot[]> slots_;
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) mutable std::atomic<uint64_t> skipped_{0};
};

// One ExitRing per vCPU, created up front.
class EXITSCOPE_EXPORT FlightRecorder {
 public:
  FlightRecorder(uint32_t num_vcpus, uint64_t events_per_vcpu);

  uint32_t num_vcpus() const noexcept { return static_cast<uint32_t>(rings_.size()); }
  // Requires vcpu < num_vcpus().
  ExitRing& ring(uint32_t vcpu) noexcept { return *rings_[vcpu]; }
  const ExitRing& ring(uint32_t vcpu) const noexcept { return *rings_[vcpu]; }

 private:
  std::vector<std::unique_ptr<ExitRing>> rings_;
};

}  // namespace exitscope
