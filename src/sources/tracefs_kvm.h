// sources/tracefs_kvm.h: live kvm records from raw tracefs pages into a KvmPairer.
//
// Pages come per CPU, each CPU's records in time order, but a vCPU thread can move between
// CPUs and the CPUs are drained one after the other, so a thread's records can arrive out of
// order across CPUs. KvmLiveFeeder decodes every record with KvmTepDecoder (no allocation per
// record: a reused vector of fixed-size KvmRecords), holds them until they are `lag` clock
// units older than the newest record seen, and feeds them to the pairer in time order, with
// each page's lost-event count reported (KvmPairer::OnLost) at its place in time. Flush(true)
// at the end feeds the rest.
//
//   RawPageDecoder pages(tep);
//   KvmLiveFeeder feeder(tep, &pairer, /*lag=*/tsc_khz * 50);   // 50 ms on x86-tsc
//   reader.Poll([&](int cpu, const uint8_t* p, size_t n) { pages.Decode(cpu, p, n, feeder); ... });
//   feeder.Flush(false);   ... at the end: feeder.Flush(true); pairer.Finish();
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_set>
#include <vector>

#include "sources/kvm_pairing.h"
#include "sources/kvm_trace.h"
#include "sources/tracefs_reader.h"

namespace exitscope::sources {

class KvmLiveFeeder : public RecordSink {
 public:
  // `thread_group` maps a thread id to its process id (the VM), -1 when unknown; it is asked
  // once per new thread. Default: /proc/TID/status.
  KvmLiveFeeder(tep_handle* tep, KvmPairer* pairer, uint64_t lag,
                std::function<int32_t(int32_t)> thread_group = ProcThreadGroup);

  void OnRecord(tep_handle* tep, tep_record* record) override;

  // Feeds every held record at least `lag` older than the newest one (all when `all`).
  void Flush(bool all);

  uint64_t kvm_records() const { return kvm_records_; }
  uint64_t other_records() const { return other_records_; }  // not kvm events: not fed
  size_t held() const { return pending_.size(); }

  static int32_t ProcThreadGroup(int32_t tid);

 private:
  struct Pending {
    KvmRecord rec;
    int64_t lost = 0;
    bool only_lost = false;
  };
  KvmTepDecoder decoder_;
  KvmPairer* pairer_;
  uint64_t lag_;
  std::function<int32_t(int32_t)> thread_group_;
  uint64_t newest_ = 0;
  uint64_t kvm_records_ = 0;
  uint64_t other_records_ = 0;
  std::vector<Pending> pending_;
  std::unordered_set<int32_t> known_;
};

}  // namespace exitscope::sources
