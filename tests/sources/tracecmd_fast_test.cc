// The .dat reader's fast path (ring_page.h) and its threads against the checked path
// (PageIsSane + libtraceevent's kbuffer, one thread), on every committed .dat in testdata
// (the captures and the crash files): the same status, every record field for field in the
// same order, the same lost-event reports, event counts and exits. Then the fast walk alone
// against kbuffer on hand-made pages: what it must refuse (long records, absolute time
// stamps, anything crossing the commit) and what it must read alike.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "sources/kvm_pairing.h"
#include "sources/ring_page.h"
#include "sources/tracecmd_dat.h"
#include "support/testdata.h"

extern "C" {
#include <traceevent/kbuffer.h>
}

namespace exitscope::sources {
namespace {

using test::CommittedDats;

// Every field of every record fed, in order, and every exit.
struct Seen : EventSink {
  std::vector<std::string> records;
  std::vector<std::string> exits;
  void OnExit(const ExitEvent& e) override {
    exits.push_back(fmt::format("{} {} {} {} {} {} {}", e.start_ns, e.duration_ns, e.reason,
                                static_cast<int>(e.subkey_kind), e.subkey, static_cast<int>(e.dir),
                                e.vm));
  }
  static void Observe(const KvmRecord& r, void* ctx) {
    static_cast<Seen*>(ctx)->records.push_back(fmt::format(
        "{} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}", r.ts,
        r.tid, r.tgid, r.cpu, static_cast<int>(r.type), r.exit_reason, r.isa, r.guest_rip, r.info1,
        r.info2, r.intr_info, r.error_code, r.vcpu_id, r.reason, r.err, r.write, r.addr, r.data,
        r.size, r.count, r.mmio_type, r.exception, r.has_error, r.prev_tid, r.next_tid,
        r.prev_state, r.insn_len, fmt::join(r.insn, ",")));
  }
};

struct ReadResult {
  bool ok = false;
  std::string error;
  uint64_t records = 0;
  std::vector<std::string> counts;
  Seen seen;
  uint64_t lost_events = 0, lost_markers = 0;
  uint64_t fast_pages = 0, checked_pages = 0;
  int threads = 0;
};

void ReadWith(const std::string& path, bool fast, int threads, ReadResult* out) {
  auto dat = TraceCmdDat::Open(path);
  ASSERT_TRUE(dat.has_value());
  (*dat)->set_fast_decode(fast);
  (*dat)->set_read_threads(threads);
  KvmPairer pairer({}, &out->seen);
  pairer.SetRecordObserver(Seen::Observe, &out->seen);
  const Status s = (*dat)->ReadAll(&pairer);
  out->ok = s.has_value();
  if (!s) out->error = s.error().message;
  out->records = (*dat)->records_read();
  for (const DatEventCount& c : (*dat)->event_counts()) {
    out->counts.push_back(fmt::format("{}:{} {}", c.system, c.name, c.count));
  }
  out->lost_events = pairer.stats().lost_events;
  out->lost_markers = pairer.stats().lost_markers;
  out->fast_pages = (*dat)->fast_pages();
  out->checked_pages = (*dat)->checked_pages();
  out->threads = (*dat)->read_threads();
}

void ExpectSame(const ReadResult& want, const ReadResult& got) {
  EXPECT_EQ(got.ok, want.ok);
  EXPECT_EQ(got.error, want.error);
  EXPECT_EQ(got.records, want.records);
  EXPECT_EQ(got.counts, want.counts);
  EXPECT_EQ(got.lost_events, want.lost_events);
  EXPECT_EQ(got.lost_markers, want.lost_markers);
  ASSERT_EQ(got.seen.records.size(), want.seen.records.size());
  for (size_t i = 0; i < want.seen.records.size(); ++i) {
    ASSERT_EQ(got.seen.records[i], want.seen.records[i]) << "record " << i;
  }
  EXPECT_EQ(got.seen.exits, want.seen.exits);
}

TEST(FastDatReader, SameEventsAsTheCheckedPathOnEveryCommittedDat) {
  const std::vector<std::string> dats = CommittedDats();
  ASSERT_GE(dats.size(), 3u);
  int opened = 0, captures = 0;
  for (const std::string& path : dats) {
    SCOPED_TRACE(path);
    if (!TraceCmdDat::Open(path).has_value()) continue;  // refused at Open: no pages read
    ++opened;
    ReadResult checked;
    ReadWith(path, false, 1, &checked);
    EXPECT_EQ(checked.fast_pages, 0u);
    for (const auto& [fast, threads] :
         {std::pair{true, 1}, std::pair{true, 4}, std::pair{false, 4}, std::pair{true, 0}}) {
      SCOPED_TRACE(fmt::format("fast {} threads {}", fast, threads));
      ReadResult got;
      ReadWith(path, fast, threads, &got);
      ExpectSame(checked, got);
      if (threads == 4) {
        EXPECT_GE(got.threads, 1);
      }
      if (fast && checked.ok) {
        EXPECT_EQ(got.fast_pages + got.checked_pages, checked.checked_pages);
      }
    }
    if (path.find("/crashes/") == std::string::npos) {
      ++captures;
      EXPECT_TRUE(checked.ok) << checked.error;
      EXPECT_GT(checked.records, 1000u);
      // The captures' pages are all of the kind the fast walk reads.
      ReadResult fast;
      ReadWith(path, true, 1, &fast);
      EXPECT_GT(fast.fast_pages, 0u);
      EXPECT_EQ(fast.checked_pages, 0u);
    }
  }
  EXPECT_GE(captures, 3);
  EXPECT_GE(opened, captures);
}

// Threads forced on: one decompressing thread per compressed CPU stream (the real v7 zstd
// capture has two), besides this one; an uncompressed file (mapped pages) gets none.
TEST(FastDatReader, OneThreadPerCompressedCpuStream) {
  const std::string path = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm/pvm-user64-pio-mmio-hlt.dat";
  ReadResult one, many;
  ReadWith(path, true, 1, &one);
  ReadWith(path, true, 2, &many);
  EXPECT_EQ(one.threads, 1);
  EXPECT_EQ(many.threads, 3);
  ExpectSame(one, many);
  const std::string flat = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host/joint-blk.dat";
  ReadResult mapped;
  ReadWith(flat, true, 2, &mapped);
  EXPECT_EQ(mapped.threads, 1);
}

// A page, little endian, 8-byte longs: header then `words` of event data.
std::vector<uint8_t> Page(uint64_t ts, const std::vector<uint32_t>& words, uint64_t flags = 0,
                          uint32_t page_size = 4096) {
  std::vector<uint8_t> p(page_size + 64, 0);
  const uint64_t commit = words.size() * 4 | flags;
  std::memcpy(p.data(), &ts, 8);
  std::memcpy(p.data() + 8, &commit, 8);
  if (!words.empty()) std::memcpy(p.data() + 16, words.data(), words.size() * 4);
  return p;
}
uint32_t Hdr(uint32_t type_len, uint32_t delta) {
  return type_len | delta << 5;
}

// What kbuffer reads from the page: (offset, size, ts) per record.
std::vector<std::tuple<uint32_t, uint32_t, uint64_t>> ByKbuffer(std::vector<uint8_t>& p) {
  std::vector<std::tuple<uint32_t, uint32_t, uint64_t>> out;
  kbuffer* kb = kbuffer_alloc(KBUFFER_LSIZE_8, KBUFFER_ENDIAN_LITTLE);
  kbuffer_load_subbuffer(kb, p.data());
  unsigned long long ts = 0;
  for (void* ev = kbuffer_read_event(kb, &ts); ev != nullptr; ev = kbuffer_next_event(kb, &ts)) {
    out.emplace_back(static_cast<uint32_t>(static_cast<uint8_t*>(ev) - p.data()),
                     static_cast<uint32_t>(kbuffer_event_size(kb)), ts);
  }
  kbuffer_free(kb);
  return out;
}
std::vector<std::tuple<uint32_t, uint32_t, uint64_t>> ByFastWalk(const std::vector<uint8_t>& p,
                                                                 bool* ok) {
  std::vector<RingEvent> ev;
  *ok = WalkRingPageFast(p.data(), 4096, &ev);
  std::vector<std::tuple<uint32_t, uint32_t, uint64_t>> out;
  for (const RingEvent& e : ev) out.emplace_back(e.offset, e.size, e.ts);
  return out;
}

TEST(FastRingPage, ReadsRecordsExtendsAndPaddingAsKbufferDoes) {
  // Two records, a time extend, a record, end-of-page padding (its length past the commit).
  std::vector<uint8_t> p = Page(
      1000, {Hdr(2, 5), 1, 2, Hdr(1, 7), 3, Hdr(30, 3), 2, Hdr(3, 1), 4, 5, 6, Hdr(29, 0), 4000});
  bool ok = false;
  const auto fast = ByFastWalk(p, &ok);
  ASSERT_TRUE(ok);
  ASSERT_EQ(fast.size(), 3u);
  EXPECT_EQ(fast, ByKbuffer(p));
  EXPECT_EQ(std::get<2>(fast[2]), 1000u + 5 + 7 + (2ull << 27) + 3 + 1);
  // Padding inside the commit is skipped.
  std::vector<uint8_t> q = Page(5, {Hdr(1, 1), 9, Hdr(29, 0), 4, Hdr(1, 2), 8});
  const auto fq = ByFastWalk(q, &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(fq.size(), 2u);
  EXPECT_EQ(fq, ByKbuffer(q));
  // A discarded record (padding with a delta, as joint-blk.dat holds): its delta counts.
  std::vector<uint8_t> r = Page(5, {Hdr(1, 1), 9, Hdr(29, 6), 4, Hdr(1, 2), 8});
  const auto fr = ByFastWalk(r, &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(fr, ByKbuffer(r));
  ASSERT_EQ(fr.size(), 2u);
  EXPECT_EQ(std::get<2>(fr[1]), 5u + 1 + 6 + 2);
  // An empty page.
  std::vector<uint8_t> e = Page(5, {});
  EXPECT_TRUE(ByFastWalk(e, &ok).empty());
  EXPECT_TRUE(ok);
}

TEST(FastRingPage, LeavesWhatItIsNotSureOfToTheCheckedPath) {
  bool ok = true;
  // type_len 0: a long record, its size in the next word.
  ByFastWalk(Page(0, {Hdr(0, 1), 12, 1, 2}), &ok);
  EXPECT_FALSE(ok);
  // type_len 31: absolute time stamp.
  ok = true;
  ByFastWalk(Page(0, {Hdr(31, 1), 2, Hdr(1, 1), 3}), &ok);
  EXPECT_FALSE(ok);
  // A record crossing the commit.
  ok = true;
  ByFastWalk(Page(0, {Hdr(4, 1), 3}), &ok);
  EXPECT_FALSE(ok);
  // A time extend cut by the commit.
  ok = true;
  ByFastWalk(Page(0, {Hdr(30, 1)}), &ok);
  EXPECT_FALSE(ok);
  // A commit larger than the page.
  ok = true;
  ByFastWalk(Page(0, {Hdr(1, 1), 3}, 4090), &ok);
  EXPECT_FALSE(ok);
  // A stored lost-event count past the page.
  ok = true;
  std::vector<uint8_t> p = Page(0, {}, (1ull << 31) | (1ull << 30) | 4076);
  ByFastWalk(p, &ok);
  EXPECT_FALSE(ok);
  // A negative padding length.
  ok = true;
  ByFastWalk(Page(0, {Hdr(29, 0), 0xfffffff0u, Hdr(1, 1), 3}), &ok);
  EXPECT_FALSE(ok);
}

}  // namespace
}  // namespace exitscope::sources
