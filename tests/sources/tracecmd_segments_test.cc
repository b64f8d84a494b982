// Reading a .dat in time segments (docs/trace-files.md "Segments") against one thread.
//
// First the pairer's side alone, on the records of the real capture: a pairer armed anywhere
// (KvmPairer::Arm) that another one takes over (CanTake, Take) gives the exits and counts of
// one pairer reading every record, and a state that differs is refused. Then the reader: on
// every committed .dat, segments as small as one chunk, one to three threads besides this
// one: the same exits field for field in the same order, the same counts, the same error;
// and the same with a device map, which the pairers of the threads share.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sources/kvm_device_map.h"
#include "sources/kvm_pairing.h"
#include "sources/tracecmd_dat.h"
#include "support/testdata.h"

namespace exitscope::sources {
namespace {

const std::string kCapture =
    std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm/pvm-user64-pio-mmio-hlt.dat";

struct Exits : EventSink {
  std::vector<ExitEvent> list;
  void OnExit(const ExitEvent& e) override { list.push_back(e); }
};

std::vector<KvmRecord> RecordsOf(const std::string& path) {
  std::vector<KvmRecord> out;
  auto dat = TraceCmdDat::Open(path);
  EXPECT_TRUE(dat.has_value());
  if (!dat) return out;
  KvmPairer p({}, nullptr);
  p.SetRecordObserver([](const KvmRecord& r,
                         void* ctx) { static_cast<std::vector<KvmRecord>*>(ctx)->push_back(r); },
                      &out);
  EXPECT_TRUE((*dat)->ReadAll(&p).has_value());
  return out;
}

void ExpectSameStats(const KvmPairingStats& got, const KvmPairingStats& want) {
  EXPECT_EQ(got.records, want.records);
  EXPECT_EQ(got.records_total, want.records_total);
  EXPECT_EQ(got.exits, want.exits);
  EXPECT_EQ(got.kernel_exits, want.kernel_exits);
  EXPECT_EQ(got.userspace_exits, want.userspace_exits);
  EXPECT_EQ(got.open_at_end, want.open_at_end);
  EXPECT_EQ(got.exits_time_unknown, want.exits_time_unknown);
  EXPECT_EQ(got.kernel_accesses, want.kernel_accesses);
  EXPECT_EQ(got.lost_events, want.lost_events);
  EXPECT_EQ(got.lost_markers, want.lost_markers);
  EXPECT_EQ(got.unpaired_exits, want.unpaired_exits);
  EXPECT_EQ(got.entries_without_exit, want.entries_without_exit);
  EXPECT_EQ(got.children_outside_exit, want.children_outside_exit);
  EXPECT_EQ(got.completions, want.completions);
  EXPECT_EQ(got.failed_vmentry, want.failed_vmentry);
}

void ExpectSameExits(const std::vector<ExitEvent>& got, const std::vector<ExitEvent>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_TRUE(got[i] == want[i]) << "exit " << i;
}

// The records [0, at) go to `truth`; a speculative pairer starts from nothing at `from`
// (<= at), is armed at `at` and reads the rest; the truth takes it over when it can.
struct Split {
  bool taken = false;
  Exits exits;
  KvmPairingStats stats;
};
Split PairSplit(const std::vector<KvmRecord>& recs, size_t from, size_t at, bool seed = true) {
  Split out;
  KvmPairer truth({}, &out.exits);
  for (size_t i = 0; i < at; ++i) truth.Feed(recs[i]);
  KvmPairer later = truth.Fresh(seed ? truth.numbering() : KvmPairer::Numbering{});
  for (size_t i = from; i < at; ++i) later.Feed(recs[i]);
  later.Arm({});
  for (size_t i = at; i < recs.size(); ++i) later.Feed(recs[i]);
  out.taken = truth.CanTake(later);
  if (out.taken) {
    truth.Take(std::move(later));
  } else {
    for (size_t i = at; i < recs.size(); ++i) truth.Feed(recs[i]);
  }
  truth.Finish();
  out.stats = truth.stats();
  return out;
}

TEST(SpeculativePairer, TakenAnywhereItGivesWhatOnePairerGives) {
  const std::vector<KvmRecord> recs = RecordsOf(kCapture);
  ASSERT_GT(recs.size(), 30000u);
  Exits one_exits;
  KvmPairer one({}, &one_exits);
  for (const KvmRecord& r : recs) one.Feed(r);
  one.Finish();
  int taken = 0, cases = 0;
  for (size_t at = 1; at < recs.size(); at += recs.size() / 37 + 1) {
    for (size_t back : {size_t{0}, size_t{1}, size_t{50}, size_t{2000}}) {
      const size_t from = at > back ? at - back : 0;
      SCOPED_TRACE(fmt::format("armed at record {}, from {}", at, from));
      const Split s = PairSplit(recs, from, at);
      ++cases;
      taken += s.taken ? 1 : 0;
      ExpectSameExits(s.exits.list, one_exits.list);
      ExpectSameStats(s.stats, one.stats());
    }
  }
  // Most places are taken: the threads it meets first in the segment are checked after two
  // of their exits, and the numbering comes from the seed.
  EXPECT_GT(taken, cases / 2) << taken << " of " << cases;
}

TEST(SpeculativePairer, ADifferentStateIsNotTaken) {
  const std::vector<KvmRecord> recs = RecordsOf(kCapture);
  ASSERT_GT(recs.size(), 30000u);
  const size_t at = recs.size() / 2;
  // The speculative pairer misses one record of the thread it vouches for from the start:
  // that thread's state where it is armed is not the truth's.
  KvmPairer truth({}, nullptr);
  for (size_t i = 0; i < at; ++i) truth.Feed(recs[i]);
  KvmPairer later = truth.Fresh(truth.numbering());
  for (size_t i = at - 400; i < at; ++i) {
    if (i != at - 3) later.Feed(recs[i]);
  }
  const KvmRecord& missed = recs[at - 3];
  later.Arm({});
  for (size_t i = at; i < recs.size(); ++i) later.Feed(recs[i]);
  // A pairer that fed the same records as `later` does take it.
  KvmPairer same({}, nullptr);
  for (size_t i = 0; i < at; ++i) {
    if (i != at - 3) same.Feed(recs[i]);
  }
  EXPECT_TRUE(same.CanTake(later)) << "record type " << static_cast<int>(missed.type);
  EXPECT_FALSE(truth.CanTake(later)) << "record type " << static_cast<int>(missed.type);
  // A loss seen after arming is never taken.
  KvmPairer lossy = truth.Fresh(truth.numbering());
  for (size_t i = at - 400; i < at; ++i) lossy.Feed(recs[i]);
  lossy.Arm({});
  lossy.OnLost(0, 5);
  EXPECT_FALSE(truth.CanTake(lossy));
}

using test::CommittedDats;

struct ReadResult {
  bool ok = false;
  std::string error;
  uint64_t records = 0, chunks = 0, pages = 0, segments = 0;
  std::vector<std::string> counts;
  Exits exits;
  KvmPairingStats stats;
};

void ReadWith(const std::string& path, int threads, uint64_t segment_chunks, ReadResult* out,
              const KvmDeviceResolver* devices = nullptr) {
  auto dat = TraceCmdDat::Open(path);
  ASSERT_TRUE(dat.has_value());
  (*dat)->set_read_threads(threads);
  (*dat)->set_segment_chunks(segment_chunks);
  KvmPairer pairer({.devices = devices}, &out->exits);
  const Status s = (*dat)->ReadAll(&pairer);
  out->ok = s.has_value();
  if (!s) out->error = s.error().message;
  out->records = (*dat)->records_read();
  out->chunks = (*dat)->chunks_read();
  out->pages = (*dat)->fast_pages() + (*dat)->checked_pages();
  out->segments = (*dat)->segments();
  for (const DatEventCount& c : (*dat)->event_counts()) {
    out->counts.push_back(fmt::format("{}:{} {}", c.system, c.name, c.count));
  }
  out->stats = pairer.stats();
}

// The same exits field for field in the same order, counts, chunks, pages and error.
void ExpectSameRead(const ReadResult& got, const ReadResult& one) {
  EXPECT_EQ(got.ok, one.ok);
  EXPECT_EQ(got.error, one.error);
  EXPECT_EQ(got.records, one.records);
  EXPECT_EQ(got.counts, one.counts);
  if (one.ok) {
    EXPECT_EQ(got.chunks, one.chunks);
    EXPECT_EQ(got.pages, one.pages);
  }
  ExpectSameExits(got.exits.list, one.exits.list);
  ExpectSameStats(got.stats, one.stats);
}

TEST(SegmentedDatReader, SameAsOneThreadOnEveryCommittedDat) {
  int segmented = 0;
  for (const std::string& path : CommittedDats()) {
    SCOPED_TRACE(path);
    if (!TraceCmdDat::Open(path).has_value()) continue;  // refused at Open: no pages read
    ReadResult one;
    ReadWith(path, 1, 0, &one);
    for (const auto& [threads, chunks] : {std::pair{2, uint64_t{1}}, std::pair{3, uint64_t{1}},
                                          std::pair{4, uint64_t{2}}, std::pair{2, uint64_t{5}}}) {
      SCOPED_TRACE(fmt::format("{} threads, {} chunk(s) a segment", threads, chunks));
      ReadResult got;
      ReadWith(path, threads, chunks, &got);
      ExpectSameRead(got, one);
      if (got.segments > 1) ++segmented;
    }
  }
  // The real v7 zstd capture is read in segments (the uncompressed ones never are).
  EXPECT_GE(segmented, 4);
}

// The same with a device map, which the pairers of the threads share: one device over each
// whole space, so that every port and MMIO exit asks it, from every thread at once. The
// threads' map is a map of its own, new for each capture: their lookups fill its cache
// concurrently (the one-thread read would otherwise have filled it first).
TEST(SegmentedDatReader, SameAsOneThreadWithADeviceMap) {
  const auto parse = [] {
    return KvmDeviceMap::Parse(
        "ports pio-all  pio  0x0 0x10000 uart16550\n"
        "mem   mmio-all mmio 0x0 0x1000000000000 virtio-mmio\n",
        "all.map");
  };
  int segmented = 0;
  uint64_t named = 0;
  for (const std::string& path : CommittedDats()) {
    SCOPED_TRACE(path);
    if (!TraceCmdDat::Open(path).has_value()) continue;
    auto one_map = parse(), shared_map = parse();
    ASSERT_TRUE(one_map.has_value() && shared_map.has_value());
    ReadResult one;
    ReadWith(path, 1, 0, &one, one_map->get());
    for (const ExitEvent& e : one.exits.list) named += e.device.empty() ? 0 : 1;
    ReadResult got;
    ReadWith(path, 3, 1, &got, shared_map->get());
    ExpectSameRead(got, one);
    if (got.segments > 1) ++segmented;
  }
  EXPECT_GE(segmented, 1);
  EXPECT_GT(named, 1000u);
}

}  // namespace
}  // namespace exitscope::sources
