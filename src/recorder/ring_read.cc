// ExitRing::ReadFrom: an incremental reader for a consumer that folds every record once (the
// metrics exporter, src/metrics), beside the snapshot code in rings.cc.
//
//   uint64_t next = 0, lost = 0;
//   std::vector<exitscope::ExitRecord> recs;
//   for (;;) {                      // every collection period
//     recs.clear();
//     lost += ring.ReadFrom(&next, &recs);
//     for (const auto& r : recs) Fold(r);
//   }
//
// ReadFrom copies records *next, *next + 1, ... (oldest first; at most capacity() of them) up
// to the newest complete record, and moves *next past the last index it handled. A record the
// ring overwrote before it could be copied (index below written() - capacity(), or overwritten
// while being copied) is not copied: the return value counts those, so over any sequence of
// calls, records copied + records returned as lost == the distance *next moved; nothing is
// lost silently. It uses the same per-slot seqlock as Snapshot and, like it, never stalls the
// writer; unlike Snapshot it does not add to skipped() (that counter is the snapshots').
#include "exitscope/flight_recorder.h"

namespace exitscope {

uint64_t ExitRing::ReadFrom(uint64_t* next, std::vector<ExitRecord>* out) const {
  const uint64_t head = head_.load(std::memory_order_acquire);
  const uint64_t cap = mask_ + 1;
  uint64_t n = *next < head ? *next : head;
  uint64_t lost = 0;
  if (head > cap && n < head - cap) {  // already overwritten: never copyable again
    lost = head - cap - n;
    n = head - cap;
  }
  out->reserve(out->size() + (head - n));
  for (; n < head; ++n) {
    const Slot& s = slots_[n & mask_];
    // n < head: record n was complete (seq 2n+2) before head moved past it; a larger seq
    // means a later lap overwrote it.
    const uint64_t s1 = s.seq.load(std::memory_order_acquire);
    if (s1 != 2 * n + 2) {
      ++lost;
      continue;
    }
    uint64_t w[kWords];
    for (int i = 0; i < kWords; ++i) w[i] = s.words[i].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != s1) {
      ++lost;
      continue;
    }
    ExitRecord r;
    std::memcpy(static_cast<void*>(&r), w, sizeof r);
    out->push_back(r);
  }
  *next = n;
  return lost;
}

}  // namespace exitscope
