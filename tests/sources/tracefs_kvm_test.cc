// The live kvm path on real kvm pages. Nothing fires kvm events on this machine, so the pages
// come from the real capture of a PVM guest (testdata/kvm, recorded on these machines): its
// raw per-CPU pages are fed, poll by poll and CPU by CPU as `exitscope kvm live` reads them,
// through RawPageDecoder and KvmLiveFeeder into a KvmPairer, and the exits must come out
// exactly as `exitscope kvm report` pairs them from the file through libtracecmd. The same
// pages then go through TraceDatWriter and the file must read back identically.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "analysis/kvm_stats.h"
#include "gtest/gtest.h"
#include "sources/host_tsc.h"
#include "sources/kvm_input.h"
#include "sources/kvm_pairing.h"
#include "sources/tracecmd_dat.h"
#include "sources/tracefs_dat.h"
#include "sources/tracefs_kvm.h"
#include "sources/tracefs_reader.h"

namespace exitscope::sources {
namespace {

constexpr uint64_t kTscKhz = 2'596'000;  // any fixed value: both paths use the same one

std::string FirstExisting(const std::vector<std::string>& paths) {
  for (const std::string& p : paths)
    if (::access(p.c_str(), R_OK) == 0) return p;
  return "";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The raw pages of each CPU of a version-6 trace-cmd file.
std::vector<std::vector<std::string>> PagesOfV6(const std::string& file, size_t page) {
  std::vector<std::vector<std::string>> out;
  const size_t opts = file.find(std::string("options  \0", 10));
  if (opts == std::string::npos || opts < 4) return out;
  uint32_t cpus = 0;
  std::memcpy(&cpus, file.data() + opts - 4, 4);
  const size_t fly = file.find(std::string("flyrecord\0", 10), opts);
  if (fly == std::string::npos || cpus == 0 || cpus > 4096) return out;
  for (uint32_t c = 0; c < cpus; ++c) {
    uint64_t off = 0, size = 0;
    std::memcpy(&off, file.data() + fly + 10 + c * 16, 8);
    std::memcpy(&size, file.data() + fly + 10 + c * 16 + 8, 8);
    std::vector<std::string> pages;
    for (uint64_t at = off; at + page <= off + size && at + page <= file.size(); at += page)
      pages.push_back(file.substr(at, page));
    out.push_back(std::move(pages));
  }
  return out;
}

struct Outcome {
  KvmPairingStats stats;
  std::map<std::string, std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>> rows;  // key ->
                                                                                   // n,sum,min,max
};

Outcome Summarise(const KvmPairer& pairer, const analysis::KvmAggregator& agg) {
  Outcome r;
  r.stats = pairer.stats();
  for (const auto& row : agg.analysis().all.rows) {
    r.rows[row->key] = {row->stats.count(), row->stats.sum(), row->stats.min(), row->stats.max()};
  }
  return r;
}

void ExpectSame(const Outcome& a, const Outcome& b) {
  EXPECT_EQ(a.stats.exits, b.stats.exits);
  EXPECT_EQ(a.stats.userspace_exits, b.stats.userspace_exits);
  EXPECT_EQ(a.stats.kernel_exits, b.stats.kernel_exits);
  EXPECT_EQ(a.stats.unpaired_exits, b.stats.unpaired_exits);
  EXPECT_EQ(a.stats.children_outside_exit, b.stats.children_outside_exit);
  EXPECT_EQ(a.stats.completions, b.stats.completions);
  EXPECT_EQ(a.stats.lost_events, b.stats.lost_events);
  for (size_t t = 1; t < kKvmEventTypeCount; ++t) {
    EXPECT_EQ(a.stats.records[t], b.stats.records[t]) << KvmEventName(static_cast<KvmEventType>(t));
  }
  EXPECT_EQ(a.rows, b.rows);
}

class TracefsKvmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string td = EXITSCOPE_TESTDATA_DIR;
    capture_ = FirstExisting({td + "/kvm/pvm-user64-pio-mmio-hlt.dat"});
    formats_ = FirstExisting({td + "/kvm/tracefs-pvm-6.18"});
    if (capture_.empty() || formats_.empty()) {
      GTEST_SKIP() << "the real PVM capture and its format files are not present in testdata/kvm";
    }
    // The capture is a compressed version-7 file; trace-cmd rewrites it as plain version 6,
    // whose CPU sections are the kernel's pages as recorded.
    v6_ = std::string(EXITSCOPE_BINARY_DIR) + "/tracefs_kvm_test-" + std::to_string(::getpid()) +
          ".v6.dat";
    const std::string cmd = "trace-cmd convert -i " + capture_ + " -o " + v6_ +
                            " --file-version 6 --compression none >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      ::unlink(v6_.c_str());
      GTEST_SKIP() << "trace-cmd convert is not available to unpack the capture's pages";
    }
    pages_ = PagesOfV6(ReadAll(v6_), 4096);
    ::unlink(v6_.c_str());
    ASSERT_FALSE(pages_.empty());
  }

  // What `exitscope kvm report` computes from a file.
  Outcome FromFile(const std::string& path, analysis::KvmEventClass cls) {
    KvmInputOptions io;
    io.tsc_khz = kTscKhz;
    auto in = KvmInput::Open(path, io);
    EXPECT_TRUE(in) << in.error().message;
    if (!in) return {};
    analysis::KvmAggregator agg({.event = cls});
    KvmPairer pairer({.clock = (*in)->scale()}, &agg);
    Status st = (*in)->ReadAll(&pairer);
    EXPECT_TRUE(st) << st.error().message;
    agg.Finish();
    return Summarise(pairer, agg);
  }

  std::string capture_, formats_, v6_;
  std::vector<std::vector<std::string>> pages_;
};

TEST_F(TracefsKvmTest, LivePathPairsRealPagesExactlyAsTheFileReader) {
  auto tep = TepEvents::Load(formats_ + "", {"kvm"});
  ASSERT_TRUE(tep) << tep.error().message;
  size_t total_pages = 0;
  for (const auto& c : pages_) total_pages += c.size();
  ASSERT_GT(total_pages, 10u);

  for (auto cls : {analysis::KvmEventClass::kVmexit, analysis::KvmEventClass::kUserspace,
                   analysis::KvmEventClass::kIoport, analysis::KvmEventClass::kMmio}) {
    const Outcome want = FromFile(capture_, cls);
    ASSERT_GT(want.stats.exits, 0u);

    analysis::KvmAggregator agg({.event = cls});
    KvmPairer pairer({.clock = ScaleForClock("x86-tsc", kTscKhz)}, &agg);
    KvmLiveFeeder feeder(tep->get(), &pairer, kTscKhz * 50, nullptr);
    RawPageDecoder decoder(tep->get());
    // Polls as live mode does: a few pages of each CPU, then a flush of what is old enough.
    std::vector<size_t> next(pages_.size(), 0);
    for (bool more = true; more;) {
      more = false;
      for (size_t cpu = 0; cpu < pages_.size(); ++cpu) {
        for (int i = 0; i < 3 && next[cpu] < pages_[cpu].size(); ++i, ++next[cpu]) {
          const std::string& p = pages_[cpu][next[cpu]];
          decoder.Decode(static_cast<int>(cpu), reinterpret_cast<const uint8_t*>(p.data()),
                         p.size(), feeder);
        }
        more = more || next[cpu] < pages_[cpu].size();
      }
      feeder.Flush(false);
    }
    feeder.Flush(true);
    pairer.Finish();
    agg.Finish();
    EXPECT_EQ(decoder.bad_pages(), 0u);
    EXPECT_EQ(feeder.held(), 0u);
    EXPECT_GT(feeder.kvm_records(), 0u);
    SCOPED_TRACE(std::string(analysis::ToString(cls)));
    ExpectSame(want, Summarise(pairer, agg));
  }
}

TEST_F(TracefsKvmTest, RealKvmPagesWrittenByTheRecorderReadBackIdentically) {
  const std::string out = std::string(EXITSCOPE_BINARY_DIR) + "/tracefs_kvm_test-" +
                          std::to_string(::getpid()) + ".dat";
  {
    auto w =
        TraceDatWriter::Create(out, {formats_, "", {"kvm"}, static_cast<int>(pages_.size()), 4096});
    ASSERT_TRUE(w) << w.error().message;
    for (size_t cpu = 0; cpu < pages_.size(); ++cpu) {
      for (const std::string& p : pages_[cpu]) {
        ASSERT_TRUE((*w)->AddPage(static_cast<int>(cpu), reinterpret_cast<const uint8_t*>(p.data()),
                                  p.size()));
      }
    }
    // The capture's clock; the buffer dir supplies trace_clock and per-CPU stats at the end.
    char dir[] = "/tmp/exitscope-kvm-buffer-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    std::ofstream(std::string(dir) + "/trace_clock") << "local global [x86-tsc]\n";
    Status st = (*w)->Finish(dir);
    ::unlink((std::string(dir) + "/trace_clock").c_str());
    ::rmdir(dir);
    ASSERT_TRUE(st) << st.error().message;
  }
  for (auto cls : {analysis::KvmEventClass::kVmexit, analysis::KvmEventClass::kIoport,
                   analysis::KvmEventClass::kMmio}) {
    SCOPED_TRACE(std::string(analysis::ToString(cls)));
    ExpectSame(FromFile(capture_, cls), FromFile(out, cls));
  }
  auto dat = TraceCmdDat::Open(out);
  ASSERT_TRUE(dat) << dat.error().message;
  EXPECT_EQ((*dat)->clock(), "x86-tsc");
  ::unlink(out.c_str());
}

}  // namespace
}  // namespace exitscope::sources
