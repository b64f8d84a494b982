// Fuzz target for trace-cmd .dat files (TraceCmdDat): the input is written to a memfd and
// opened by its /proc/self/fd path, since Open takes a path. Open forks a child to parse the
// event formats with libtraceevent (a crash there becomes an error, not a crash here); under
// afl-fuzz that child is a child of the forked test process and is waited for as usual.
// The mapped reader runs twice, one thread each: with the fast page walk (ring_page.h) and
// with the checked path only (PageIsSane + kbuffer); any difference in status, records,
// lost-event reports or event counts is an invariant failure (the fast path must read what
// kbuffer reads, or leave the page to it). libtracecmd's iterator is not run: it has no
// isolation from libtracecmd's crashes, by design (a reference for tests).
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "fuzz_target.h"
#include "sources/kvm_pairing.h"
#include "sources/tracecmd_dat.h"

using exitscope::Isa;
using namespace exitscope::sources;

namespace {

// What one read gave: a hash of every record fed (all fields), counts and the status.
struct Outcome {
  uint64_t hash = 1469598103934665603ull;
  uint64_t records = 0, lost_events = 0, lost_markers = 0;
  std::vector<uint64_t> counts;
  bool ok = false;
  std::string error;
  bool operator==(const Outcome&) const = default;
};

void Mix(uint64_t* h, uint64_t v) {
  *h = (*h ^ v) * 1099511628211ull;
}

void Observe(const KvmRecord& r, void* ctx) {
  uint64_t* h = &static_cast<Outcome*>(ctx)->hash;
  for (uint64_t v : {r.ts,
                     static_cast<uint64_t>(r.tid),
                     uint64_t{r.cpu},
                     static_cast<uint64_t>(r.type),
                     uint64_t{r.exit_reason},
                     uint64_t{r.isa},
                     r.guest_rip,
                     r.info1,
                     r.info2,
                     uint64_t{r.intr_info},
                     uint64_t{r.error_code},
                     static_cast<uint64_t>(r.vcpu_id),
                     uint64_t{r.reason},
                     static_cast<uint64_t>(r.err),
                     uint64_t{r.write},
                     r.addr,
                     r.data,
                     uint64_t{r.size},
                     uint64_t{r.count},
                     uint64_t{r.mmio_type},
                     static_cast<uint64_t>(r.prev_tid),
                     static_cast<uint64_t>(r.next_tid),
                     r.prev_state,
                     uint64_t{r.insn_len}}) {
    Mix(h, v);
  }
}

Outcome ReadOnce(TraceCmdDat* dat, bool fast) {
  Outcome o;
  dat->set_fast_decode(fast);
  dat->set_read_threads(1);
  KvmPairer pairer({}, nullptr);
  pairer.SetRecordObserver(Observe, &o);
  const exitscope::Status s = dat->ReadAll(&pairer);
  o.ok = s.has_value();
  if (!s) o.error = s.error().message;
  o.records = dat->records_read();
  o.lost_events = pairer.stats().lost_events;
  o.lost_markers = pairer.stats().lost_markers;
  for (const DatEventCount& c : dat->event_counts()) o.counts.push_back(c.count);
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = exitscope::fuzz::MemFile(data, size);
  if (fd < 0) return 0;
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (auto dat = TraceCmdDat::Open(path)) {
    const Outcome fast = ReadOnce(dat->get(), true);
    const Outcome checked = ReadOnce(dat->get(), false);
    if (!(fast == checked)) {
      exitscope::fuzz::InvariantFailed(
          "dat: the fast page walk and the checked path (kbuffer) read different records");
    }
  }
  ::close(fd);
  return 0;
}
