// End to end, on this machine's KVM: `exitscope kvm stat --bpf` (the in-kernel aggregation of
// src/sources/bpf) counts the same exits as the VMM itself and as the tracefs path, for the
// same guest run. One run is seen three ways at once:
//
//   exitscope kvm record -o F -- exitscope kvm stat --bpf --format json --event E
//       -- exitscope run --guest G ...        (one command line)
//
// `kvm record` streams the kvm tracepoints of its process tree from tracefs into F (then
// `kvm report -i F` pairs them in userspace), `kvm stat --bpf` pairs them in the kernel for
// the VMM's process, and the VMM prints its own per-kind counts. Per reason (--event
// userspace) and per port / MMIO address (--event ioport|mmio) the counts must be equal.
// Skips with the reason printed without /dev/kvm, without tracefs or where BPF is not
// possible (not built, no BTF, no permission).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../metrics/metrics_text.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "sources/bpf/bpf_kvm_stat.h"
#include "sources/tracefs_session.h"
#include "support/run.h"

namespace exitscope::sources {
namespace {

const std::string kBin = std::string(EXITSCOPE_BINARY_DIR) + "/exitscope";

using test::FreePort;
using test::Ran;
using test::ReadFile;

// The kvm report JSON document in `text`: one line (kvm stat) or the whole text (kvm report).
nlohmann::json ReportJson(const std::string& text) {
  const auto is_report = [](const nlohmann::json& j) {
    return j.is_object() && j.contains("schema") && j.contains("all");
  };
  if (auto j = nlohmann::json::parse(text, nullptr, false); is_report(j)) return j;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;
    if (auto j = nlohmann::json::parse(line, nullptr, false); is_report(j)) return j;
  }
  return nlohmann::json();
}

struct Counts {
  uint64_t samples = 0, to_vmm = 0, in_kernel = 0;
  bool operator==(const Counts&) const = default;
};
std::ostream& operator<<(std::ostream& os, const Counts& c) {
  return os << "{samples " << c.samples << ", to_vmm " << c.to_vmm << ", in_kernel " << c.in_kernel
            << "}";
}

// Rows of a kvm report JSON by key, plus the exits open at end by key.
std::map<std::string, Counts> Rows(const nlohmann::json& j) {
  std::map<std::string, Counts> rows;
  for (const auto& r : j.at("all").at("rows")) {
    rows[r.at("key").get<std::string>()] = {r.at("samples").get<uint64_t>(),
                                            r.at("to_vmm").get<uint64_t>(),
                                            r.at("in_kernel").get<uint64_t>()};
  }
  return rows;
}
std::map<std::string, uint64_t> OpenAtEnd(const nlohmann::json& j) {
  std::map<std::string, uint64_t> open;
  for (const auto& e : j.at("open_at_end")) ++open[e.at("key").get<std::string>()];
  return open;
}

// The VMM's own counts of one vCPU run: "exits: N (io A, mmio B, hlt C, intr D)".
struct VmmCounts {
  uint64_t exits = 0, io = 0, mmio = 0, hlt = 0, intr = 0;
};
VmmCounts VmmOwn(const std::string& err) {
  VmmCounts c;
  const std::regex re(R"(exits: (\d+) \(io (\d+), mmio (\d+), hlt (\d+), intr (\d+)\))");
  for (std::sregex_iterator it(err.begin(), err.end(), re), end; it != end; ++it) {
    c.exits += std::stoull((*it)[1]);
    c.io += std::stoull((*it)[2]);
    c.mmio += std::stoull((*it)[3]);
    c.hlt += std::stoull((*it)[4]);
    c.intr += std::stoull((*it)[5]);
  }
  return c;
}

// What every test here needs: the binary, /dev/kvm, tracefs (restored exactly after) and BPF.
class BpfKvmStatEnv : public ::testing::Test {
 protected:
  virtual std::string Pairing() const { return "auto"; }  // --bpf-pairing of RunGuest
  void SetUp() override {
    if (::access(kBin.c_str(), X_OK) != 0) GTEST_SKIP() << kBin << " not built";
    SKIP_WITHOUT_KVM();  // these tests run real guests
    ::unsetenv("EXITSCOPE_TRACEFS");
    auto dir = FindTracefs();
    if (!dir) GTEST_SKIP() << "tracefs not usable: " << dir.error().message;
    tracefs_ = *dir;
    // Is BPF possible here? The command says so in one line when it is not.
    Ran probe = test::Run({kBin, "kvm", "stat", "--bpf", "--duration", "0.05", "--format", "json"});
    if (probe.err.find("--bpf not possible here") != std::string::npos) {
      GTEST_SKIP() << probe.err;
    }
    ASSERT_EQ(probe.status, 0) << probe.out << probe.err;
    auto s = TracefsSettings::Capture(tracefs_, {"kvm"});
    ASSERT_TRUE(s) << s.error().message;
    before_ = std::make_unique<TracefsSettings>(std::move(*s));
    char tmpl[] = "/tmp/exitscope-bpf-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
  }
  void TearDown() override {
    if (before_) {
      auto after = TracefsSettings::Capture(tracefs_, {"kvm"});
      ASSERT_TRUE(after);
      EXPECT_EQ(before_->Diff(*after), std::vector<std::string>{}) << "tracefs not restored";
    }
    if (!tmp_.empty()) {
      for (const char* f :
           {"/guest.dat", "/serial.txt", "/disk.img", "/map.esdump", "/out.txt", "/err.txt"})
        ::unlink((tmp_ + f).c_str());
      ::rmdir(tmp_.c_str());
    }
  }

  // One guest run seen by the VMM, by `kvm stat --bpf` and by `kvm record` + `kvm report`.
  struct Seen {
    nlohmann::json bpf, tracefs;
    VmmCounts vmm;
  };
  // via_shell: the VMM is a child of `sh -c '...; true'` (not exec'd by the shell), so
  // `kvm stat` counts it only by following CMD's children.
  Seen RunGuest(const std::string& guest, const std::string& arg, const std::string& event,
                bool via_shell = false) {
    Seen s;
    const std::string dat = tmp_ + "/guest.dat";
    std::vector<std::string> cmd = {kBin,
                                    "kvm",
                                    "record",
                                    "-o",
                                    dat,
                                    "--",
                                    kBin,
                                    "kvm",
                                    "stat",
                                    "--bpf",
                                    "--bpf-pairing",
                                    Pairing(),
                                    "--format",
                                    "json",
                                    "--event",
                                    event,
                                    "--",
                                    kBin,
                                    "run",
                                    "--guest",
                                    guest,
                                    "--vcpus",
                                    "1",
                                    "--no-dump",
                                    "--serial",
                                    tmp_ + "/serial.txt",
                                    "--disk",
                                    tmp_ + "/disk.img"};
    if (!arg.empty()) {
      cmd.push_back("--guest-arg");
      cmd.push_back(arg);
    }
    if (via_shell) {
      auto vmm = std::find(cmd.begin() + 8, cmd.end(), "--") + 1;  // kvm stat's CMD
      std::string line;
      for (auto it = vmm; it != cmd.end(); ++it) line += "'" + *it + "' ";
      cmd.erase(vmm, cmd.end());
      cmd.insert(cmd.end(), {"/bin/sh", "-c", line + "; true"});
    }
    Ran r = test::Run(cmd);
    if (r.err.find("the kvm-run pairing is not possible here") != std::string::npos) {
      skipped_ = r.err.substr(0, r.err.find('\n'));
      return s;
    }
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_EQ(r.err.find("not possible"), std::string::npos) << r.err;
    s.bpf = ReportJson(r.out);
    s.vmm = VmmOwn(r.err);
    EXPECT_GT(s.vmm.exits, 0u) << r.err;
    Ran rep = test::Run({kBin, "kvm", "report", "-i", dat, "--format", "json", "--event", event});
    EXPECT_EQ(rep.status, 0) << rep.err;
    s.tracefs = ReportJson(rep.out);
    EXPECT_FALSE(s.bpf.is_null()) << r.out;
    EXPECT_FALSE(s.tracefs.is_null()) << rep.out;
    return s;
  }

  // Per reason: each KVM_EXIT_* row (plus the exits of that reason open at the end) is the
  // VMM's own count of that kind, and every row equals the tracefs path's.
  void CheckReasons(const std::string& guest, const std::string& arg, bool via_shell = false) {
    SCOPED_TRACE(guest + (via_shell ? " via sh -c" : ""));
    Seen s = RunGuest(guest, arg, "userspace", via_shell);
    if (HasFailure() || !skipped_.empty()) return;
    const auto bpf = Rows(s.bpf), tfs = Rows(s.tracefs);
    const auto bpf_open = OpenAtEnd(s.bpf), tfs_open = OpenAtEnd(s.tracefs);
    EXPECT_EQ(bpf, tfs) << s.bpf.dump() << "\n" << s.tracefs.dump();
    EXPECT_EQ(bpf_open, tfs_open);
    const auto count = [&](const std::string& k) {
      const auto it = bpf.find(k);
      const auto o = bpf_open.find(k);
      return (it != bpf.end() ? it->second.samples : 0) + (o != bpf_open.end() ? o->second : 0);
    };
    EXPECT_EQ(count("IO"), s.vmm.io);
    EXPECT_EQ(count("MMIO"), s.vmm.mmio);
    EXPECT_EQ(count("HLT"), s.vmm.hlt);
    // Hits of the two tracepoints every pairing reads, as tracefs saw them (the kvm-run
    // pairing counts each KVM_RUN's kvm_fpu unload at its kvm_userspace_exit).
    for (const char* tp : {"kvm_userspace_exit", "kvm_fpu"}) {
      EXPECT_EQ(s.bpf["pairing"]["records"][tp], s.tracefs["pairing"]["records"][tp]) << tp;
      EXPECT_GT(s.bpf["pairing"]["records"][tp].get<uint64_t>(), 0u) << tp;
    }
  }

  // Per port (ioport) or address (mmio): every row equals the tracefs path's, accesses that
  // reached the VMM add up to its own count, the others were handled in the kernel.
  void CheckKeys(const std::string& guest, const std::string& arg, const std::string& event) {
    SCOPED_TRACE(guest + " --event " + event);
    Seen s = RunGuest(guest, arg, event);
    if (HasFailure() || !skipped_.empty()) return;
    const auto bpf = Rows(s.bpf), tfs = Rows(s.tracefs);
    EXPECT_EQ(bpf, tfs) << s.bpf.dump() << "\n" << s.tracefs.dump();
    EXPECT_EQ(OpenAtEnd(s.bpf), OpenAtEnd(s.tracefs));
    EXPECT_FALSE(bpf.empty());
    uint64_t to_vmm = 0;
    for (const auto& [k, c] : bpf) to_vmm += c.to_vmm;
    for (const auto& [k, n] : OpenAtEnd(s.bpf)) to_vmm += n;
    EXPECT_EQ(to_vmm, event == "ioport" ? s.vmm.io : s.vmm.mmio) << s.bpf.dump();
  }

  std::string tracefs_, tmp_;
  std::string skipped_;  // why a run was refused (kvm-run not possible on this host)
  std::unique_ptr<TracefsSettings> before_;
};

// Each test runs with both in-kernel pairings (--bpf-pairing): kvm-run (kvm_fpu and the
// vCPU's kvm_run; hosts where kvm_exit never fires) and tracepoints (every kvm tracepoint,
// paired as kvm report pairs them).
class BpfKvmStatTest : public BpfKvmStatEnv, public ::testing::WithParamInterface<std::string> {
 protected:
  std::string Pairing() const override { return GetParam(); }
};

#define SKIP_IF_REFUSED() \
  if (!skipped_.empty()) GTEST_SKIP() << skipped_

TEST_P(BpfKvmStatTest, MmioStormReasonsEqualTheVmmsAndTracefsCounts) {
  CheckReasons("mmio-storm", "2000");
  SKIP_IF_REFUSED();
}

// -- CMD with the VMM a child of CMD (a shell, a wrapper): the program follows CMD's forks.
TEST_P(BpfKvmStatTest, CmdsChildrenAreCountedToo) {
  CheckReasons("mmio-storm", "2000", /*via_shell=*/true);
  SKIP_IF_REFUSED();
}

TEST_P(BpfKvmStatTest, MmioStormPortsAndAddressesEqualTheVmmsAndTracefsCounts) {
  CheckKeys("mmio-storm", "2000", "ioport");
  CheckKeys("mmio-storm", "2000", "mmio");
  SKIP_IF_REFUSED();
}

TEST_P(BpfKvmStatTest, BlkReasonsEqualTheVmmsAndTracefsCounts) {
  CheckReasons("blk", "");
  SKIP_IF_REFUSED();
}

TEST_P(BpfKvmStatTest, BlkPortsAndAddressesEqualTheVmmsAndTracefsCounts) {
  CheckKeys("blk", "", "ioport");
  CheckKeys("blk", "", "mmio");
  SKIP_IF_REFUSED();
}

// --metrics: while `kvm stat --bpf` counts a real guest, /metrics (fetched over HTTP) has the
// guest's MMIO exits by device and register (named by a dump of the same guest as
// --device-map), read from the maps; the series grow between scrapes.
TEST_P(BpfKvmStatTest, MetricsEndpointServesTheGuestsRegistersDuringTheRun) {
  const std::string map = tmp_ + "/map.esdump";
  Ran d = test::Run({kBin, "run", "--guest", "mmio-storm", "--guest-arg", "10", "--vcpus", "1",
                     "--dump", map, "--serial", tmp_ + "/serial.txt"});
  ASSERT_EQ(d.status, 0) << d.err;
  const uint16_t port = FreePort();
  ASSERT_NE(port, 0);
  const std::string out = tmp_ + "/out.txt", err = tmp_ + "/err.txt";
  const std::vector<std::string> argv = {kBin,
                                         "kvm",
                                         "stat",
                                         "--bpf",
                                         "--bpf-pairing",
                                         GetParam(),
                                         "--event",
                                         "mmio",
                                         "--device-map",
                                         map,
                                         "--metrics",
                                         "127.0.0.1:" + std::to_string(port),
                                         "--",
                                         kBin,
                                         "run",
                                         "--guest",
                                         "mmio-storm",
                                         "--guest-arg",
                                         "200000",
                                         "--vcpus",
                                         "1",
                                         "--no-dump",
                                         "--duration",
                                         "3",
                                         "--serial",
                                         tmp_ + "/serial.txt"};
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(o, 1);
    ::dup2(e, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ASSERT_GT(pid, 0);
  int st = 0;
  bool exited = false;
  double first = 0, last = 0;  // MMIO exits to named registers, first and last scrape with any
  std::string page, labels;
  while (!exited) {
    if (::waitpid(pid, &st, WNOHANG) == pid) {
      exited = true;
      break;
    }
    if (auto body = exitscope::testing::HttpGet("127.0.0.1", port, "/metrics")) {
      std::string error;
      const auto samples = exitscope::testing::ParseExposition(*body, &error);
      ASSERT_TRUE(error.empty()) << error << "\n" << *body;
      double named = 0;
      for (const auto& s : exitscope::testing::Select(
               samples, "exitscope_exit_duration_seconds_count", {{"kind", "MMIO"}})) {
        const std::string dev = s.labels.count("device") ? s.labels.at("device") : "";
        const std::string reg = s.labels.count("register") ? s.labels.at("register") : "";
        if (dev.empty() || dev == "unassigned" || reg.empty()) continue;
        named += s.value;
        labels = dev + "." + reg;
      }
      if (named > 0) {
        if (first == 0) first = named;
        last = named;
        page = *body;
      }
    }
    ::usleep(300'000);
  }
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ReadFile(err);
  EXPECT_NE(ReadFile(err).find("metrics on http://127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << ReadFile(err);
  EXPECT_GT(first, 0) << "no MMIO series with a device and register during the run\n"
                      << ReadFile(err);
  EXPECT_GT(last, first) << "the series did not grow between scrapes: " << labels << "\n" << page;
}

// Where BPF is not possible (here: the kernel's BTF file pretended missing), one line says so
// and the tracefs path's table comes out, with the VMM's own counts.
TEST_P(BpfKvmStatTest, WithoutBtfItSaysSoInOneLineAndStreamsFromTracefs) {
  ::setenv("EXITSCOPE_KERNEL_BTF", "/nonexistent/vmlinux", 1);
  Ran r = test::Run({kBin, "kvm", "stat", "--bpf", "--event", "ioport", "--", kBin, "run",
                     "--guest", "mmio-storm", "--guest-arg", "500", "--vcpus", "1", "--no-dump",
                     "--serial", tmp_ + "/serial.txt"});
  ::unsetenv("EXITSCOPE_KERNEL_BTF");
  EXPECT_EQ(r.status, 0) << r.err;
  const std::string want =
      "exitscope kvm stat: --bpf not possible here: no kernel BTF (/nonexistent/vmlinux: No such "
      "file or directory); streaming from tracefs instead\n";
  size_t lines = 0;
  for (size_t at = r.err.find("not possible"); at != std::string::npos;
       at = r.err.find("not possible", at + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << r.err;
  EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("exitscope kvm stat (tracefs): final"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("IO Port Access"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0x3f8:POUT"), std::string::npos) << r.out;
  const VmmCounts vmm = VmmOwn(r.err);
  EXPECT_GT(vmm.io, 0u) << r.err;
  // "Total Samples:N" of the ioport table counts port accesses, every PIO exit among them but
  // those open at the end (the exit that ends the guest).
  const size_t total = r.out.find("Total Samples:");
  ASSERT_NE(total, std::string::npos) << r.out;
  uint64_t open = 0;
  std::smatch m;
  if (std::regex_search(r.out, m, std::regex("Open at end of trace: ([0-9]+) exits")))
    open = std::stoull(m[1]);
  EXPECT_GE(std::stoull(r.out.substr(total + 14)) + open, vmm.io) << r.out;
}

// --bpf-pairing auto (the default) picks the kvm-run pairing exactly where kvm_exit never
// fires: kvm_pvm loaded and neither kvm_intel nor kvm_amd (--bpf-stats names the pairing).
using BpfKvmStatAuto = BpfKvmStatEnv;
TEST_F(BpfKvmStatAuto, PicksKvmRunWhereKvmExitNeverFires) {
  Ran r = test::Run({kBin, "kvm", "stat", "--bpf", "--bpf-stats", "--", kBin, "run", "--guest",
                     "hello", "--vcpus", "1", "--no-dump", "--serial", tmp_ + "/serial.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto loaded = [](const char* m) {
    return ::access((std::string("/sys/module/") + m).c_str(), F_OK) == 0;
  };
  const bool pvm_only = loaded("kvm_pvm") && !loaded("kvm_intel") && !loaded("kvm_amd");
  EXPECT_NE(r.err.find(pvm_only ? "attached as kvm-run pairing" : "attached as tracepoint pairing"),
            std::string::npos)
      << r.err;
}

// BpfKvmStat::Detach() stops the counting and Attach() starts it again on the same maps (what
// bench/kvm_bpf_overhead --interleave switches): a guest run while detached adds nothing, one
// run after Attach() is counted exit for exit as the VMM counted it.
using BpfKvmStatReattach = BpfKvmStatEnv;
TEST_F(BpfKvmStatReattach, DetachedCountsNothingAndAttachCountsAgain) {
  bpf::BpfKvmOptions o;
  o.tgid = static_cast<uint32_t>(::getpid());
  o.follow_children = true;  // the `exitscope run` children below
  o.access_kinds = 0;
  auto stat = bpf::BpfKvmStat::Open(o);
  ASSERT_TRUE(stat) << stat.error().message;
  // Userspace exits ended (in the maps) and still open (in the in-flight map).
  const auto exits = [&] {
    auto snap = (*stat)->Read();
    EXPECT_TRUE(snap) << snap.error().message;
    uint64_t n = 0;
    if (!snap) return n;
    for (const auto& s : snap->samples)
      if (s.key.flags & KS_F_USERSPACE) n += s.stats.timed + s.stats.untimed;
    for (const ks_thread& t : snap->threads) n += t.phase == KS_USER_EXIT;
    return n;
  };
  const std::vector<std::string> guest = {kBin,      "run",      "--guest",           "mmio-storm",
                                          "--vcpus", "1",        "--no-dump",         "--guest-arg",
                                          "300",     "--serial", tmp_ + "/serial.txt"};
  (*stat)->Detach();
  Ran off = test::Run(guest);
  ASSERT_EQ(off.status, 0) << off.err;
  ASSERT_GT(VmmOwn(off.err).exits, 0u) << off.err;
  EXPECT_EQ(exits(), 0u);
  ASSERT_TRUE((*stat)->Attach());
  ASSERT_TRUE((*stat)->Attach());  // attached already: nothing to do
  Ran on = test::Run(guest);
  ASSERT_EQ(on.status, 0) << on.err;
  (*stat)->Detach();
  ASSERT_GT(VmmOwn(on.err).exits, 0u) << on.err;
  EXPECT_EQ(exits(), VmmOwn(on.err).exits) << on.err;
}

INSTANTIATE_TEST_SUITE_P(Pairing, BpfKvmStatTest, ::testing::Values("kvm-run", "tracepoints"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return i.param == "kvm-run" ? std::string("KvmRun")
                                                       : std::string("Tracepoints");
                         });

// Bad usage gets one line and status 2, as every subcommand.
TEST(BpfKvmStatCli, BadUsageGetsOneLine) {
  if (::access(kBin.c_str(), X_OK) != 0) GTEST_SKIP() << kBin << " not built";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{kBin, "kvm", "stat", "--bpf", "--event", "nope"},
        std::vector<std::string>{kBin, "kvm", "stat", "--bpf", "--bpf-pairing", "nope"},
        std::vector<std::string>{kBin, "kvm", "stat", "--bpf", "-d", "-1"},
        std::vector<std::string>{kBin, "kvm", "stat", "--bpf", "--format", "xml"},
        std::vector<std::string>{kBin, "kvm", "stat", "--bpf", "-p", "1", "--", "true"},
        std::vector<std::string>{kBin, "kvm", "stat", "--bpf", "--metrics", "nohost:x"}}) {
    Ran r = test::Run(args);
    EXPECT_EQ(r.status, 2) << args.back() << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("exitscope kvm stat: ", 0), 0u) << r.err;
  }
  Ran help = test::Run({kBin, "help", "kvm", "stat"});
  EXPECT_EQ(help.status, 0) << help.err;
  EXPECT_NE(help.out.find("--bpf"), std::string::npos) << help.out;
}

}  // namespace
}  // namespace exitscope::sources
