// sources/tracefs_kvm.cc: see tracefs_kvm.h.
#include "sources/tracefs_kvm.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>

#include "fmt/format.h"

extern "C" {
#include <event-parse.h>
}

namespace exitscope::sources {

KvmLiveFeeder::KvmLiveFeeder(tep_handle* tep, KvmPairer* pairer, uint64_t lag,
                             std::function<int32_t(int32_t)> thread_group)
    : decoder_(tep), pairer_(pairer), lag_(lag), thread_group_(std::move(thread_group)) {}

int32_t KvmLiveFeeder::ProcThreadGroup(int32_t tid) {
  std::ifstream in(fmt::format("/proc/{}/status", tid));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Tgid:", 0) == 0) return static_cast<int32_t>(std::atol(line.c_str() + 5));
  }
  return -1;
}

void KvmLiveFeeder::OnRecord(tep_handle*, tep_record* rec) {
  Pending p;
  p.lost = rec->missed_events;
  if (decoder_.Decode(rec, static_cast<uint32_t>(rec->cpu), &p.rec)) {
    ++kvm_records_;
  } else {
    ++other_records_;
    if (p.lost == 0) return;
    // Not ours, but it carries its page's loss report: keep that at its place in time.
    p.rec = KvmRecord{};
    p.rec.ts = rec->ts;
    p.rec.cpu = static_cast<uint32_t>(rec->cpu);
    p.only_lost = true;
  }
  newest_ = std::max(newest_, p.rec.ts);
  pending_.push_back(p);
}

void KvmLiveFeeder::Flush(bool all) {
  std::stable_sort(pending_.begin(), pending_.end(),
                   [](const Pending& a, const Pending& b) { return a.rec.ts < b.rec.ts; });
  const uint64_t cutoff =
      all ? std::numeric_limits<uint64_t>::max() : (newest_ > lag_ ? newest_ - lag_ : 0);
  size_t n = 0;
  for (; n < pending_.size() && pending_[n].rec.ts <= cutoff; ++n) {
    const Pending& p = pending_[n];
    if (p.lost != 0) pairer_->OnLost(p.rec.cpu, p.lost);
    if (p.only_lost) continue;
    if (thread_group_ && known_.insert(p.rec.tid).second) {
      const int32_t tgid = thread_group_(p.rec.tid);
      if (tgid > 0) pairer_->SetThreadGroup(p.rec.tid, tgid);
    }
    pairer_->Feed(p.rec);
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
}

}  // namespace exitscope::sources
