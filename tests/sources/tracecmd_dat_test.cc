// The .dat reader on the real capture (testdata/kvm/pvm-user64-pio-mmio-hlt.dat, taken on a
// kvm-pvm host): record counts per event and per port / MMIO address must equal what
// `trace-cmd report` prints for the same file (run here when trace-cmd is installed, else the
// report text shipped beside the capture), and the text parser must agree with the .dat
// reader exit for exit. Truncated and corrupt files get an error naming file and offset.
#include "sources/tracecmd_dat.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "sources/kvm_input.h"
#include "sources/trace_text.h"
#include "sources/tracecmd_dat_layout.h"

namespace exitscope::sources {
namespace {

const std::string kDat = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm/pvm-user64-pio-mmio-hlt.dat";
const std::string kTxt = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm/pvm-user64-pio-mmio-hlt.txt";

// What trace-cmd report says, counted with plain string searches (independent of
// trace_text.cc): records per event name, kvm_pio per port, kvm_mmio per gpa.
struct ReportCounts {
  std::map<std::string, uint64_t> events;
  std::map<uint64_t, uint64_t> pio_ports;
  std::map<uint64_t, uint64_t> mmio_gpas;
  std::string source;
};

ReportCounts CountReportText(std::istream& in) {
  ReportCounts c;
  std::string line;
  while (std::getline(in, line)) {
    const size_t rb = line.find("]");
    if (rb == std::string::npos) continue;
    const size_t c1 = line.find(": ", rb);
    if (c1 == std::string::npos) continue;
    const size_t c2 = line.find(':', c1 + 2);
    if (c2 == std::string::npos) continue;
    std::string name = line.substr(c1 + 2, c2 - c1 - 2);
    while (!name.empty() && name.front() == ' ') name.erase(0, 1);
    ++c.events[name];
    if (name == "kvm_pio") {
      const size_t at = line.find(" at 0x");
      c.pio_ports[std::stoull(line.substr(at + 4), nullptr, 16)]++;
    } else if (name == "kvm_mmio") {
      const size_t at = line.find(" gpa 0x");
      c.mmio_gpas[std::stoull(line.substr(at + 5), nullptr, 16)]++;
    }
  }
  return c;
}

ReportCounts ExpectedCounts() {
  if (std::system("trace-cmd -h >/dev/null 2>&1") == 0 ||
      std::system("command -v trace-cmd >/dev/null 2>&1") == 0) {
    const std::string cmd = "trace-cmd report '" + kDat + "' 2>/dev/null";
    if (FILE* p = popen(cmd.c_str(), "r")) {
      std::string out;
      char buf[1 << 16];
      size_t n;
      while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
      if (pclose(p) == 0 && !out.empty()) {
        std::istringstream in(out);
        ReportCounts c = CountReportText(in);
        c.source = "trace-cmd report (run now)";
        return c;
      }
    }
  }
  std::ifstream in(kTxt);
  ReportCounts c = CountReportText(in);
  c.source = "shipped trace-cmd report text";
  return c;
}

struct Observed {
  std::map<std::string, uint64_t> events;
  std::map<uint64_t, uint64_t> pio_ports;
  std::map<uint64_t, uint64_t> mmio_gpas;
};

void Observe(const KvmRecord& r, void* ctx) {
  auto* o = static_cast<Observed*>(ctx);
  if (r.type == KvmEventType::kOther) return;
  ++o->events[std::string(KvmEventName(r.type))];
  if (r.type == KvmEventType::kPio) ++o->pio_ports[r.addr];
  if (r.type == KvmEventType::kMmio) ++o->mmio_gpas[r.addr];
}

using ExitKey = std::tuple<uint64_t, uint64_t, std::string, int, uint64_t, int, uint32_t>;
struct ExitList : EventSink {
  std::vector<ExitKey> exits;
  void OnExit(const ExitEvent& e) override {
    exits.emplace_back(e.start_ns, e.duration_ns, std::string(e.reason),
                       static_cast<int>(e.subkey_kind), e.subkey, static_cast<int>(e.dir), e.vm);
  }
};

class CaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kDat)) GTEST_SKIP() << "capture not found: " << kDat;
  }
};

TEST_F(CaptureTest, OpensWithClockAndCpus) {
  auto dat = TraceCmdDat::Open(kDat);
  ASSERT_TRUE(dat.has_value()) << dat.error().message;
  EXPECT_EQ((*dat)->clock(), "x86-tsc");
  EXPECT_EQ((*dat)->cpus(), 2);
  EXPECT_EQ((*dat)->lost_at_record_time(), 0u);
}

TEST_F(CaptureTest, CountsMatchTraceCmdReport) {
  const ReportCounts want = ExpectedCounts();
  ASSERT_FALSE(want.events.empty());
  SCOPED_TRACE(want.source);

  auto dat = TraceCmdDat::Open(kDat);
  ASSERT_TRUE(dat.has_value()) << dat.error().message;
  Observed got;
  ExitList exits;
  KvmPairer pairer({}, &exits);
  pairer.SetRecordObserver(Observe, &got);
  ASSERT_TRUE((*dat)->ReadAll(&pairer).has_value());

  // Every kvm event we decode has exactly trace-cmd's count; the rest are "other".
  uint64_t other = 0;
  for (const auto& [name, n] : want.events) {
    if (KvmEventFromName(name) == KvmEventType::kOther) {
      other += n;
      continue;
    }
    EXPECT_EQ(got.events[name], n) << name;
  }
  EXPECT_EQ(pairer.stats().records[0], other);
  EXPECT_EQ(pairer.stats().records_total, (*dat)->records_read());
  EXPECT_EQ(got.pio_ports, want.pio_ports);
  EXPECT_EQ(got.mmio_gpas, want.mmio_gpas);
  // The capture's known contents (testdata/kvm/README.md): 6205 userspace exits (IO, MMIO, HLT).
  EXPECT_EQ(want.events.at("kvm_userspace_exit"), 6205u);
  EXPECT_EQ(want.pio_ports.at(0x3f8), 3001u);
  EXPECT_EQ(want.mmio_gpas.at(0xd0000), 3000u);

  // Every userspace exit is either paired or counted as unpaired: none dropped.
  const KvmPairingStats& s = pairer.stats();
  EXPECT_EQ(s.userspace_exits + s.unpaired_exits, want.events.at("kvm_userspace_exit"));
  EXPECT_EQ(s.exits, exits.exits.size());
  EXPECT_EQ(s.kernel_exits, 0u);  // kvm_exit never fires on kvm-pvm
  EXPECT_EQ(s.lost_events, 0u);
}

TEST_F(CaptureTest, TextParserAgreesWithDatReader) {
  ExitList from_dat, from_text;
  Observed dat_records, text_records;
  {
    auto dat = TraceCmdDat::Open(kDat);
    ASSERT_TRUE(dat.has_value());
    KvmPairer p({}, &from_dat);
    p.SetRecordObserver(Observe, &dat_records);
    ASSERT_TRUE((*dat)->ReadAll(&p).has_value());
  }
  {
    auto text = TraceText::Open(kTxt);
    ASSERT_TRUE(text.has_value()) << text.error().message;
    EXPECT_EQ((*text)->flavor(), TextFlavor::kTraceCmdReport);
    EXPECT_EQ((*text)->clock(), "x86-tsc");
    KvmPairer p({}, &from_text);
    p.SetRecordObserver(Observe, &text_records);
    const Status s = (*text)->ReadAll(&p);
    ASSERT_TRUE(s.has_value()) << s.error().message;
  }
  EXPECT_EQ(dat_records.events, text_records.events);
  EXPECT_EQ(dat_records.pio_ports, text_records.pio_ports);
  EXPECT_EQ(dat_records.mmio_gpas, text_records.mmio_gpas);
  ASSERT_EQ(from_dat.exits.size(), from_text.exits.size());
  EXPECT_EQ(from_dat.exits, from_text.exits);
  EXPECT_GT(from_dat.exits.size(), 6000u);
}

// The capture is a version 7 file whose CPU data trace-cmd compressed with zstd (23 chunks on
// CPU 0): this reader decompresses it itself and must give the same records and exits as
// libtracecmd's own iterator.
TEST_F(CaptureTest, OwnReaderAgreesWithLibTraceCmdOnCompressedData) {
  ExitList own, iterated;
  Observed own_records, iterated_records;
  uint64_t chunks = 0;
  for (bool allow : {true, false}) {
    auto dat = TraceCmdDat::Open(kDat);
    ASSERT_TRUE(dat.has_value());
    EXPECT_EQ((*dat)->version(), 7);
    EXPECT_EQ((*dat)->compression(), "zstd");
    (*dat)->set_mapped_reader(allow);
    KvmPairer p({}, allow ? &own : &iterated);
    p.SetRecordObserver(Observe, allow ? &own_records : &iterated_records);
    const Status s = (*dat)->ReadAll(&p);
    ASSERT_TRUE(s.has_value()) << s.error().message;
    EXPECT_EQ((*dat)->used_mapped_reader(), allow);
    if (allow) chunks = (*dat)->chunks_read();
  }
  EXPECT_EQ(chunks, 24u);  // 23 on CPU 0, 1 on CPU 1
  EXPECT_EQ(own_records.events, iterated_records.events);
  EXPECT_EQ(own.exits, iterated.exits);
  EXPECT_GT(own.exits.size(), 6000u);
}

// Every event, kvm or not, is counted by name, and the counts equal trace-cmd report's.
TEST_F(CaptureTest, EventCountsByNameMatchTraceCmdReport) {
  const ReportCounts want = ExpectedCounts();
  SCOPED_TRACE(want.source);
  auto dat = TraceCmdDat::Open(kDat);
  ASSERT_TRUE(dat.has_value()) << dat.error().message;
  KvmPairer p({}, nullptr);
  ASSERT_TRUE((*dat)->ReadAll(&p).has_value());
  std::map<std::string, uint64_t> got;
  uint64_t total = 0;
  for (const DatEventCount& c : (*dat)->event_counts()) {
    got[c.name] += c.count;
    total += c.count;
  }
  EXPECT_EQ(got, want.events);
  EXPECT_EQ(total, (*dat)->records_read());
}

TEST_F(CaptureTest, KvmInputDetectsBothFormats) {
  auto dat = KvmInput::Open(kDat, {.tsc_khz = 2'596'000});
  ASSERT_TRUE(dat.has_value()) << dat.error().message;
  EXPECT_EQ((*dat)->format_name(), "trace-cmd .dat");
  EXPECT_EQ((*dat)->tsc_khz(), 2'596'000u);
  EXPECT_FALSE((*dat)->tsc_khz_from_host());
  auto txt = KvmInput::Open(kTxt, {.tsc_khz = 2'596'000});
  ASSERT_TRUE(txt.has_value()) << txt.error().message;
  EXPECT_EQ((*txt)->format_name(), "trace-cmd report");
}

class CorruptDatTest : public CaptureTest {
 protected:
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path =
        ::testing::TempDir() + "/" + std::to_string(::getpid()) + "." + name;  // ctest -j
    std::ofstream(path, std::ios::binary) << bytes;
    written_.push_back(path);
    return path;
  }
  void TearDown() override {
    for (const std::string& p : written_) std::filesystem::remove(p);
  }
  std::vector<std::string> written_;
  std::string Original() {
    std::ifstream f(kDat, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
};

TEST_F(CorruptDatTest, TruncatedAnywhereIsAnErrorNamingFileAndOffset) {
  const std::string all = Original();
  for (size_t cut : {size_t{5}, size_t{100}, size_t{4096}, all.size() / 2, all.size() - 2000}) {
    const std::string path = Write("trunc.dat", all.substr(0, cut));
    auto dat = TraceCmdDat::Open(path);
    Status s;
    if (dat.has_value()) {
      KvmPairer p({}, nullptr);
      s = (*dat)->ReadAll(&p);
    } else {
      s = Unexpected(dat.error());
    }
    ASSERT_FALSE(s.has_value()) << "cut at " << cut;
    EXPECT_EQ(s.error().code, ErrorCode::kCorrupt) << cut;
    EXPECT_NE(s.error().message.find(path), std::string::npos) << s.error().message;
    EXPECT_NE(s.error().message.find("offset"), std::string::npos) << s.error().message;
  }
}

TEST_F(CorruptDatTest, BadMagicAndFutureVersionAreRefused) {
  std::string all = Original();
  std::string bad = all;
  bad[1] = 'X';
  auto a = TraceCmdDat::Open(Write("bad.dat", bad));
  ASSERT_FALSE(a.has_value());
  EXPECT_NE(a.error().message.find("offset 0"), std::string::npos) << a.error().message;
  std::string future = all;
  future[10] = '9';
  auto b = TraceCmdDat::Open(Write("future.dat", future));
  ASSERT_FALSE(b.has_value());
  EXPECT_EQ(b.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(b.error().message.find("version"), std::string::npos) << b.error().message;
  auto c = TraceCmdDat::Open(::testing::TempDir() + "/does-not-exist.dat");
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().code, ErrorCode::kIo);
}

TEST_F(CorruptDatTest, CorruptCpuDataIsRefused) {
  std::string all = Original();
  for (size_t i = 0; i < 64; ++i) all[0x1000 + 8 * 4096 + 16 + i] = '\xff';
  const std::string path = Write("corrupt.dat", all);
  auto dat = TraceCmdDat::Open(path);
  Status s;
  if (dat.has_value()) {
    KvmPairer p({}, nullptr);
    s = (*dat)->ReadAll(&p);
  } else {
    s = Unexpected(dat.error());
  }
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message.find(path), std::string::npos);
}

// A decompressed section's memory: every byte usable at every size; from 1 MiB on in 2 MiB
// aligned mappings, which transparent huge pages can back (tracecmd_dat_layout.h).
TEST(DatSections, PopulatedBytesHoldsEveryByteInSmallAndLargeMappings) {
  for (const size_t n :
       {size_t{1}, size_t{4096}, size_t{100000}, (size_t{1} << 20) - 1, size_t{1} << 20,
        size_t{2012676}, (size_t{2} << 20) + 1, size_t{5} << 20}) {
    SCOPED_TRACE(n);
    PopulatedBytes b(n);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(b.size(), n);
    for (size_t i = 0; i < n; ++i) b.data()[i] = static_cast<uint8_t>(i * 7 + 1);
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) wrong += b.data()[i] != static_cast<uint8_t>(i * 7 + 1);
    EXPECT_EQ(wrong, 0u);
    if (n >= (size_t{1} << 20)) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (size_t{2} << 20), 0u);
    }
  }
  PopulatedBytes none(0);
  EXPECT_EQ(none.data(), nullptr);
  EXPECT_EQ(none.size(), 0u);
}

}  // namespace
}  // namespace exitscope::sources
