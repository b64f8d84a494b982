// A trace-cmd .dat (version 6, TraceDatWriter) holding kvm_exit / kvm_entry records of VMX,
// SVM and PVM laid out by the real 6.18 format files, packed into ring-buffer pages on two
// CPUs: read back through libtracecmd (iterator) and through the mapped-page reader, both
// must give the same exits, and `trace-cmd report` (when installed) must see every record.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "kvm_tep_fixture.h"
#include "sources/kvm_dat_pages.h"
#include "sources/kvm_pairing.h"
#include "sources/tracecmd_dat.h"
#include "sources/tracefs_dat.h"

namespace exitscope::sources {
namespace {

namespace fs = std::filesystem;
using exitscope::testing::RealKvmFormats;

// A tracefs directory for TraceDatWriter: the real 6.18 event formats (committed test data)
// and the local clock.
void MakeTracefs(const fs::path& tracefs) {
  fs::create_directories(tracefs);
  fs::copy(testing::KvmTestdata("tracefs-pvm-6.18/events"), tracefs / "events",
           fs::copy_options::recursive);
  std::ofstream(tracefs / "trace_clock") << "[local] global counter\n";
}

struct Exits : EventSink {
  std::vector<std::tuple<uint64_t, uint64_t, std::string, uint32_t, uint64_t>> list;
  void OnExit(const ExitEvent& e) override {
    list.emplace_back(e.start_ns, e.duration_ns, std::string(e.reason), e.vcpu, e.subkey);
  }
};

class KvmDatRoundTrip : public ::testing::Test {
 protected:
  void SetUp() override {
    // The format files are committed test data: missing ones are a failure, not a skip.
    ASSERT_GT(formats_.loaded(), 0) << "kvm format files not found";
    // Tests of this file run as parallel processes (ctest -j): one folder per process.
    dir_ = fs::path(::testing::TempDir()) /
           ("kvm_dat_roundtrip." + std::to_string(::getpid()) + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    MakeTracefs(dir_ / "tracefs");
    path_ = (dir_ / "exits.dat").string();
    TraceDatWriter::Layout layout;
    layout.tracefs_dir = (dir_ / "tracefs").string();
    layout.systems = {"kvm"};
    layout.cpus = 2;
    auto w = TraceDatWriter::Create(path_, layout);
    ASSERT_TRUE(w.has_value()) << w.error().message;
    std::vector<RingPageWriter> pages;
    for (int cpu = 0; cpu < 2; ++cpu) {
      pages.emplace_back([&w, cpu](const std::vector<uint8_t>& p) {
        ASSERT_TRUE((*w)->AddPage(cpu, p.data(), p.size()).has_value());
      });
    }
    // vCPU thread 500 on CPU 0: VMX exits; thread 501 on CPU 1: SVM then PVM exits.
    uint64_t ts = 1'000'000'000;
    for (int i = 0; i < 3000; ++i) {
      const uint32_t vmx[] = {12, 30, 48, 0x80000021};
      auto e = formats_.Build(
          "kvm_exit", 500,
          {{"exit_reason", vmx[i % 4]}, {"isa", 1}, {"vcpu_id", 0}, {"info1", 0x3f80000}});
      pages[0].Add(ts, e);
      pages[0].Add(ts + 700 + static_cast<uint64_t>(i % 5),
                   formats_.Build("kvm_entry", 500, {{"vcpu_id", 0}}));
      const bool svm = i < 1500;
      auto e2 = formats_.Build("kvm_exit", 501,
                               {{"exit_reason", svm ? 0x7cu : 0x20000u},
                                {"isa", svm ? 2u : 3u},
                                {"vcpu_id", 1},
                                {"info2", 0x17088200 + static_cast<uint64_t>(i % 10)}});
      pages[1].Add(ts + 100, e2);
      pages[1].Add(ts + 400, formats_.Build("kvm_entry", 501, {{"vcpu_id", 1}}));
      ts += 5000 + (i == 1000 ? (uint64_t{1} << 28) : 0);  // one gap needing a time extend
    }
    for (auto& p : pages) p.Flush();
    ASSERT_TRUE((*w)->Finish((dir_ / "tracefs").string()).has_value());
  }

  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  RealKvmFormats formats_;
  fs::path dir_;
  std::string path_;
};

TEST_F(KvmDatRoundTrip, MappedAndIteratedReadersAgree) {
  Exits mapped, iterated;
  for (bool allow : {true, false}) {
    auto dat = TraceCmdDat::Open(path_);
    ASSERT_TRUE(dat.has_value()) << dat.error().message;
    EXPECT_EQ((*dat)->cpus(), 2);
    (*dat)->set_mapped_reader(allow);
    KvmPairer p({}, allow ? &mapped : &iterated);
    const Status s = (*dat)->ReadAll(&p);
    ASSERT_TRUE(s.has_value()) << s.error().message;
    EXPECT_EQ((*dat)->used_mapped_reader(), allow);
    EXPECT_EQ((*dat)->records_read(), 12000u);
    EXPECT_EQ(p.stats().kernel_exits, 6000u);
    EXPECT_EQ(p.stats().unpaired_exits, 0u);
    EXPECT_EQ(p.stats().failed_vmentry, 750u);
  }
  ASSERT_EQ(mapped.list.size(), 6000u);
  EXPECT_EQ(mapped.list, iterated.list);
  // Decoded per record from isa: VMX, SVM and PVM hypercalls by info2.
  size_t hlt = 0, io = 0, msr = 0, hc_wrmsr = 0, hc_load_pgtbl = 0;
  for (const auto& [start, dur, reason, vcpu, sub] : mapped.list) {
    hlt += reason == "HLT";
    io += reason == "IO_INSTRUCTION" && sub == 0x3f8;
    msr += reason == "msr";
    hc_wrmsr += reason == "HC_WRMSR";
    hc_load_pgtbl += reason == "HC_LOAD_PGTBL";
  }
  EXPECT_EQ(hlt, 750u);
  EXPECT_EQ(io, 750u);
  EXPECT_EQ(msr, 1500u);
  EXPECT_EQ(hc_wrmsr, 150u);
  EXPECT_EQ(hc_load_pgtbl, 150u);
}

TEST_F(KvmDatRoundTrip, TraceCmdReportReadsEveryRecord) {
  if (std::system("command -v trace-cmd >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "trace-cmd not installed";
  }
  FILE* p = popen(("trace-cmd report '" + path_ + "' 2>/dev/null").c_str(), "r");
  ASSERT_NE(p, nullptr);
  char line[512];
  size_t exits = 0, entries = 0;
  while (std::fgets(line, sizeof(line), p)) {
    exits += std::strstr(line, "kvm_exit:") != nullptr;
    entries += std::strstr(line, "kvm_entry:") != nullptr;
  }
  EXPECT_EQ(pclose(p), 0);
  EXPECT_EQ(exits, 6000u);
  EXPECT_EQ(entries, 6000u);
}

// libtracecmd itself crashes on some truncated version 6 files: every cut must instead give
// a clear error naming the file and an offset.
TEST_F(KvmDatRoundTrip, TruncatedAnywhereIsReportedWithOffset) {
  const uint64_t size = fs::file_size(path_);
  const std::string cut = (dir_ / "cut.dat").string();
  for (uint64_t at : {uint64_t{11}, uint64_t{20}, uint64_t{200}, uint64_t{3000}, uint64_t{20000},
                      size / 2, size - 4096, size - 1}) {
    fs::copy_file(path_, cut, fs::copy_options::overwrite_existing);
    fs::resize_file(cut, at);
    auto dat = TraceCmdDat::Open(cut);
    Status s;
    if (dat.has_value()) {
      KvmPairer p({}, nullptr);
      s = (*dat)->ReadAll(&p);
    } else {
      s = Unexpected(dat.error());
    }
    ASSERT_FALSE(s.has_value()) << "cut at " << at;
    EXPECT_EQ(s.error().code, ErrorCode::kCorrupt) << at;
    EXPECT_NE(s.error().message.find(cut + ": offset "), std::string::npos) << s.error().message;
  }
}

// The mapped reader's merge of the CPU streams: it takes a run of records from one stream
// while they stay below the next stream's (a heap of streams above 16 CPUs, a scan below),
// and breaks ties by the lower CPU, as libtracecmd's iterator does. Threads migrate (an exit
// on one CPU, its entry on the next), some CPUs have long runs, and timestamps tie across
// CPUs: every record must come in libtracecmd's order, with one thread or several.
class KvmDatMerge : public ::testing::TestWithParam<int> {};

struct Seq {
  std::vector<std::tuple<uint64_t, uint32_t, int32_t, int>> records;
  static void Observe(const KvmRecord& r, void* ctx) {
    static_cast<Seq*>(ctx)->records.emplace_back(r.ts, r.cpu, r.tid, static_cast<int>(r.type));
  }
};

TEST_P(KvmDatMerge, RunsTiesAndMigrationsInLibtracecmdsOrder) {
  const int cpus = GetParam();
  RealKvmFormats formats;
  ASSERT_GT(formats.loaded(), 0) << "kvm format files not found";
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("kvm_dat_merge." + std::to_string(::getpid()) + "." + std::to_string(cpus));
  fs::remove_all(dir);
  MakeTracefs(dir / "tracefs");
  // Per CPU, (timestamp, order, record): sorted before they go into pages.
  std::vector<std::vector<std::tuple<uint64_t, int, std::vector<uint8_t>>>> per_cpu(cpus);
  int order = 0;
  const auto add = [&](int cpu, uint64_t ts, std::vector<uint8_t> rec) {
    per_cpu[cpu].emplace_back(ts, order++, std::move(rec));
  };
  uint64_t t = 1'000'000'000;
  for (int i = 0; i < 400; ++i) {
    for (int c = 0; c < cpus; ++c) {
      const int32_t tid = 700 + c;
      add(c, t + c % 3, formats.Build("kvm_exit", tid, {{"exit_reason", 12}, {"isa", 1}}));
      const int entry_cpu = i % 7 == 0 ? (c + 1) % cpus : c;  // migrated in the exit
      add(entry_cpu, t + 300 + c % 2, formats.Build("kvm_entry", tid, {}));
    }
    if (i % 50 == 0) {  // a run: 40 exits of one CPU's own thread before any other record
      const int c = i % cpus;
      for (int k = 0; k < 40; ++k) {
        add(c, t + 1000 + 50 * k,
            formats.Build("kvm_exit", 900, {{"exit_reason", 30}, {"isa", 1}}));
        add(c, t + 1020 + 50 * k, formats.Build("kvm_entry", 900, {}));
      }
    }
    t += 5000;
  }
  std::string path = (dir / "merge.dat").string();
  {
    TraceDatWriter::Layout layout;
    layout.tracefs_dir = (dir / "tracefs").string();
    layout.systems = {"kvm"};
    layout.cpus = cpus;
    auto w = TraceDatWriter::Create(path, layout);
    ASSERT_TRUE(w.has_value()) << w.error().message;
    for (int c = 0; c < cpus; ++c) {
      std::sort(per_cpu[c].begin(), per_cpu[c].end(), [](const auto& a, const auto& b) {
        return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
      });
      RingPageWriter pages([&w, c](const std::vector<uint8_t>& p) {
        ASSERT_TRUE((*w)->AddPage(c, p.data(), p.size()).has_value());
      });
      for (const auto& [ts, o, rec] : per_cpu[c]) pages.Add(ts, rec);
      pages.Flush();
    }
    ASSERT_TRUE((*w)->Finish((dir / "tracefs").string()).has_value());
  }
  const auto read = [&](bool mapped, int threads, Seq* seq, Exits* exits) {
    auto dat = TraceCmdDat::Open(path);
    ASSERT_TRUE(dat.has_value()) << dat.error().message;
    (*dat)->set_mapped_reader(mapped);
    (*dat)->set_read_threads(threads);
    KvmPairer p({}, exits);
    p.SetRecordObserver(Seq::Observe, seq);
    const Status s = (*dat)->ReadAll(&p);
    ASSERT_TRUE(s.has_value()) << s.error().message;
  };
  Seq iterated, one;
  Exits iterated_exits, one_exits;
  read(false, 1, &iterated, &iterated_exits);
  read(true, 1, &one, &one_exits);
  EXPECT_EQ(iterated.records.size(), static_cast<size_t>(order));
  EXPECT_EQ(one.records, iterated.records);
  EXPECT_EQ(one_exits.list, iterated_exits.list);
  EXPECT_EQ(one_exits.list.size(), static_cast<size_t>(400 * cpus + 8 * 40));
  // The same as version 7 with zstd chunks, as trace-cmd 3.1 writes by default: read with a
  // decompressing thread per CPU stream too.
  if (std::system("command -v trace-cmd >/dev/null 2>&1") == 0) {
    const std::string v6 = path;
    path = (dir / "merge-v7.dat").string();
    ASSERT_EQ(
        std::system(("trace-cmd convert -i '" + v6 + "' --file-version 7 --compression zstd -o '" +
                     path + "' >/dev/null 2>&1")
                        .c_str()),
        0);
    for (int threads : {1, 4}) {
      SCOPED_TRACE(fmt::format("version 7, zstd, {} thread(s)", threads));
      Seq seq;
      Exits exits;
      read(true, threads, &seq, &exits);
      EXPECT_EQ(seq.records, iterated.records);
      EXPECT_EQ(exits.list, iterated_exits.list);
    }
  } else {
    std::printf("trace-cmd not installed: the version 7 (zstd) half of this test did not run\n");
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Cpus, KvmDatMerge, ::testing::Values(3, 20),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::to_string(p.param) + (p.param > 16 ? "Heap" : "Scan");
                         });

// Open gives libtraceevent only the formats the kvm decoder reads (kvm, kvmmmu, sched): a real
// capture holds every format of its host, about 2000. Records of any other event are still
// counted, named from their format's header lines, as trace-cmd report names them; an id no
// format declares stays "unknown".
TEST(KvmDatOtherSystems, RecordsOfUnparsedEventsAreCountedByTheirName) {
  RealKvmFormats formats;
  ASSERT_GT(formats.loaded(), 0) << "kvm format files not found";
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("kvm_dat_other." + std::to_string(::getpid()));
  fs::remove_all(dir);
  MakeTracefs(dir / "tracefs");
  // irq_handler_entry as Linux 6.18's tracefs gives it (events/irq/irq_handler_entry/format).
  fs::create_directories(dir / "tracefs/events/irq/irq_handler_entry");
  std::ofstream(dir / "tracefs/events/irq/irq_handler_entry/format")
      << "name: irq_handler_entry\nID: 225\nformat:\n"
         "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
         "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
         "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
         "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
         "\tfield:int irq;\toffset:8;\tsize:4;\tsigned:1;\n"
         "\tfield:__data_loc char[] name;\toffset:12;\tsize:4;\tsigned:0;\n\n"
         "print fmt: \"irq=%d name=%s\", REC->irq, __get_str(name)\n";
  const std::string path = (dir / "other.dat").string();
  TraceDatWriter::Layout layout;
  layout.tracefs_dir = (dir / "tracefs").string();
  layout.systems = {"kvm", "irq"};
  layout.cpus = 1;
  auto w = TraceDatWriter::Create(path, layout);
  ASSERT_TRUE(w.has_value()) << w.error().message;
  RingPageWriter pages([&w](const std::vector<uint8_t>& p) {
    ASSERT_TRUE((*w)->AddPage(0, p.data(), p.size()).has_value());
  });
  // irq 11 "eth0": common fields, irq, __data_loc (length << 16 | offset), the string.
  std::vector<uint8_t> irq(24, 0);
  const uint16_t id = 225;
  const int32_t pid = 0, line = 11;
  const uint32_t loc = (5u << 16) | 16u;
  std::memcpy(irq.data(), &id, 2);
  std::memcpy(irq.data() + 4, &pid, 4);
  std::memcpy(irq.data() + 8, &line, 4);
  std::memcpy(irq.data() + 12, &loc, 4);
  std::memcpy(irq.data() + 16, "eth0", 5);
  std::vector<uint8_t> undeclared = irq;  // an id no format of the file declares
  const uint16_t stray = 4000;
  std::memcpy(undeclared.data(), &stray, 2);
  uint64_t ts = 1'000'000'000;
  for (int i = 0; i < 100; ++i) {
    pages.Add(ts, formats.Build("kvm_exit", 500, {{"exit_reason", 12}, {"isa", 1}}));
    pages.Add(ts + 300, irq);
    pages.Add(ts + 700, formats.Build("kvm_entry", 500, {}));
    ts += 5000;
  }
  pages.Add(ts, undeclared);
  pages.Flush();
  ASSERT_TRUE((*w)->Finish((dir / "tracefs").string()).has_value());

  auto dat = TraceCmdDat::Open(path);
  ASSERT_TRUE(dat.has_value()) << dat.error().message;
  KvmPairer p({}, nullptr);
  ASSERT_TRUE((*dat)->ReadAll(&p).has_value());
  std::vector<std::string> counts;
  for (const DatEventCount& c : (*dat)->event_counts()) {
    counts.push_back(c.system + ":" + c.name + " " + std::to_string(c.count));
  }
  EXPECT_EQ(counts, (std::vector<std::string>{"#4000:unknown 1", "irq:irq_handler_entry 100",
                                              "kvm:kvm_entry 100", "kvm:kvm_exit 100"}));
  EXPECT_EQ((*dat)->records_read(), 301u);
  EXPECT_EQ(p.stats().kernel_exits, 100u);
  EXPECT_EQ(p.stats().records[static_cast<size_t>(KvmEventType::kOther)], 101u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace exitscope::sources
