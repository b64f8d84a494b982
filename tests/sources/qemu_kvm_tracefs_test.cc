// A real, unmodified QEMU (Debian's qemu-system-x86, `-accel kvm`) under `exitscope kvm
// record`, named by its own memory tree: the ports its guest touched resolve to QEMU's region
// names, and the counts per port and per device equal what QEMU's own trace logged
// (`-trace memory_region_ops_read -trace memory_region_ops_write`: one line per access that
// reached a QEMU device, with the region's name).
//
// The guest is a few bytes of real-mode code given as -bios (docs/host-facts.md section 1: SeaBIOS
// does not boot here). It enables q35's ECAM window (so the map has pcie-mmcfg-mmio), touches
// chosen ports a known number of times, writes "AAAAA" to COM1 last and halts with
// interrupts off. The test then reads `info mtree -f` through QMP from that same QEMU (also
// `kvm report --qmp`), quits it through QMP, and runs
// `kvm report --event ioport --device-map <that map>` on the recording.
//
// Skips with a printed reason where /dev/kvm, tracefs, qemu-system-x86_64 (install-deps.sh
// installs it where it can) or the exitscope binary is missing. Tracefs is left as found.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "sources/qemu_qmp.h"
#include "sources/tracefs_session.h"
#include "support/run.h"
#include "support/tracefs.h"

namespace exitscope::sources {
namespace {

const std::string kBin = std::string(EXITSCOPE_BINARY_DIR) + "/exitscope";

// The guest, 16-bit real mode. QEMU maps the 64 KiB image at 0xffff0000 (and its copy at
// 0xf0000); the CPU starts at CS base 0xffff0000, IP 0xfff0, where a near jump goes to IP 0.
// Each access below is one exit to QEMU except the writes to 0x70, which QEMU coalesces (the
// kernel traces them; QEMU's trace logs them when it flushes the coalesced ring).
const std::vector<uint8_t> kGuestCode = {
    0xfa,                                // cli
    0x66, 0xb8, 0x60, 0x00, 0x00, 0x80,  // mov eax, 0x80000060 (00:00.0 PCIEXBAR)
    0xba, 0xf8, 0x0c,                    // mov dx, 0xcf8
    0x66, 0xef,                          // out dx, eax         pci-conf-idx x1
    0x66, 0xb8, 0x01, 0x00, 0x00, 0xb0,  // mov eax, 0xb0000001 (ECAM at 0xb0000000, on)
    0xba, 0xfc, 0x0c,                    // mov dx, 0xcfc
    0x66, 0xef,                          // out dx, eax         pci-conf-data x1
    0xba, 0xfd, 0x03,                    // mov dx, 0x3fd
    0xb9, 0x03, 0x00,                    // mov cx, 3
    0xec,                                // in al, dx           serial LSR x3
    0xe2, 0xfd,                          // loop -3
    0xb9, 0x04, 0x00,                    // mov cx, 4
    0xe6, 0x80,                          // out 0x80, al        ioport80 x4
    0xe2, 0xfc,                          // loop -4
    0xb9, 0x02, 0x00,                    // mov cx, 2
    0xb0, 0x0a,                          // mov al, 0x0a        (CMOS register A)
    0xe6, 0x70,                          // out 0x70, al        rtc-index x2 (coalesced)
    0xe4, 0x71,                          // in al, 0x71         rtc x2
    0xe2, 0xf8,                          // loop -8
    0xe4, 0x60,                          // in al, 0x60         i8042-data x1
    0xba, 0x00, 0x03,                    // mov dx, 0x300
    0xec,                                // in al, dx           no device: QEMU's "io" x1
    0xb0, 0x41,                          // mov al, 'A'
    0xba, 0xf8, 0x03,                    // mov dx, 0x3f8
    0xb9, 0x05, 0x00,                    // mov cx, 5
    0xee,                                // out dx, al          serial THR x5
    0xe2, 0xfd,                          // loop -3
    0xf4,                                // hlt (interrupts off: for good)
    0xeb, 0xfd,                          // jmp -3 (back to hlt)
};
// At image offset 0xfff0 (the reset vector): jmp near 0x0000 (0x0000 - 0xfff3 = 0x000d).
const std::vector<uint8_t> kResetVector = {0xe9, 0x0d, 0x00};

using test::Instances;
using test::Ran;
using test::ReadFile;

pid_t Spawn(const std::vector<std::string>& argv, const std::string& out, const std::string& err) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    ::dup2(in, 0);
    ::dup2(o, 1);
    ::dup2(e, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

int Wait(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

Ran RunCli(const std::vector<std::string>& argv, const std::string& tmp) {
  Ran r;
  r.status = Wait(Spawn(argv, tmp + "/run.out", tmp + "/run.err"));
  r.out = ReadFile(tmp + "/run.out");
  r.err = ReadFile(tmp + "/run.err");
  return r;
}

std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    const std::string p = dir + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return {};
}

// QEMU's trace, per "0x<port>:POUT|PIN": the region name and how many accesses it logged.
struct TraceRow {
  std::string region;
  uint64_t count = 0;
};
std::map<std::string, TraceRow> QemuTraceByPort(const std::string& log, uint64_t* io_exits) {
  std::map<std::string, TraceRow> rows;
  *io_exits = 0;
  std::stringstream ss(log);
  std::string line;
  while (std::getline(ss, line)) {
    // "kvm_run_exit cpu_index 0, reason 2" (2 = KVM_EXIT_IO)
    if (line.rfind("kvm_run_exit ", 0) == 0) {
      if (line.ends_with(", reason 2")) ++*io_exits;
      continue;
    }
    // "memory_region_ops_write cpu 0 mr 0x... addr 0x3f8 value 0x41 size 1 name 'serial'"
    const bool write = line.rfind("memory_region_ops_write ", 0) == 0;
    const bool read = line.rfind("memory_region_ops_read ", 0) == 0;
    if (!write && !read) continue;
    const size_t a = line.find(" addr 0x"), n = line.find(" name '");
    if (a == std::string::npos || n == std::string::npos) continue;
    const uint64_t addr = std::stoull(line.substr(a + 8), nullptr, 16);
    char key[32];
    std::snprintf(key, sizeof key, "%#llx:%s", static_cast<unsigned long long>(addr),
                  write ? "POUT" : "PIN");
    TraceRow& r = rows[key];
    r.region = line.substr(n + 7, line.size() - n - 8);
    ++r.count;
  }
  return rows;
}

class QemuKvmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kBin.c_str(), X_OK) != 0) GTEST_SKIP() << kBin << " not built";
    const int kvm = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (kvm < 0) GTEST_SKIP() << "/dev/kvm: " << std::strerror(errno) << ": no KVM on this host";
    ::close(kvm);
    qemu_ = FindInPath("qemu-system-x86_64");
    if (qemu_.empty()) {
      GTEST_SKIP() << "qemu-system-x86_64 not installed (scripts/install-deps.sh installs "
                      "Debian's qemu-system-x86 where it can)";
    }
    ::unsetenv("EXITSCOPE_TRACEFS");
    auto dir = FindTracefs();
    if (!dir) GTEST_SKIP() << "tracefs not usable: " << dir.error().message;
    tracefs_ = *dir;
    auto s = TracefsSettings::Capture(tracefs_, {"kvm"});
    ASSERT_TRUE(s) << s.error().message;
    before_ = std::make_unique<TracefsSettings>(std::move(*s));
    instances_ = Instances(tracefs_);
    char tmpl[] = "/tmp/exitscope-qemu-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
  }
  void TearDown() override {
    if (record_ > 0) {
      ::kill(record_, SIGINT);
      Wait(record_);
    }
    if (!before_) return;
    auto after = TracefsSettings::Capture(tracefs_, {"kvm"});
    ASSERT_TRUE(after);
    EXPECT_EQ(before_->Diff(*after), std::vector<std::string>{}) << "tracefs not restored";
    EXPECT_EQ(Instances(tracefs_), instances_) << "an instance was left behind";
    if (DIR* d = ::opendir(tmp_.c_str())) {
      while (dirent* e = ::readdir(d))
        if (e->d_name[0] != '.') ::unlink((tmp_ + "/" + e->d_name).c_str());
      ::closedir(d);
    }
    ::rmdir(tmp_.c_str());
  }
  std::string qemu_, tracefs_, tmp_;
  std::unique_ptr<TracefsSettings> before_;
  std::vector<std::string> instances_;
  pid_t record_ = -1;
};

TEST_F(QemuKvmTest, PortsOfARealQemuRunAreNamedByItsMemoryTreeAndCountedAsItsTrace) {
  std::vector<uint8_t> image(65536, 0xf4);
  std::copy(kGuestCode.begin(), kGuestCode.end(), image.begin());
  std::copy(kResetVector.begin(), kResetVector.end(), image.begin() + 0xfff0);
  const std::string bios = tmp_ + "/bios.bin", qmp = tmp_ + "/qmp.sock", hmp = tmp_ + "/hmp.sock",
                    serial = tmp_ + "/serial.out", trace = tmp_ + "/qemu-trace.log",
                    dat = tmp_ + "/run.dat", mtree = tmp_ + "/mtree.txt";
  {
    std::ofstream f(bios, std::ios::binary);
    f.write(reinterpret_cast<const char*>(image.data()),
            static_cast<std::streamsize>(image.size()));
  }
  record_ = Spawn({kBin,
                   "kvm",
                   "record",
                   "-o",
                   dat,
                   "--",
                   qemu_,
                   "-accel",
                   "kvm",
                   "-M",
                   "q35",
                   "-m",
                   "64",
                   "-nographic",
                   "-nodefaults",
                   "-bios",
                   bios,
                   "-chardev",
                   "file,id=ser0,path=" + serial,
                   "-device",
                   "isa-serial,chardev=ser0",
                   "-qmp",
                   "unix:" + qmp + ",server=on,wait=off",
                   "-monitor",
                   "unix:" + hmp + ",server=on,wait=off",
                   "-trace",
                   "memory_region_ops_read",
                   "-trace",
                   "memory_region_ops_write",
                   "-trace",
                   "kvm_run_exit",
                   "-D",
                   trace},
                  tmp_ + "/record.out", tmp_ + "/record.err");
  // The guest's last act is "AAAAA" on COM1; then it halts for good.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (ReadFile(serial) != "AAAAA" && std::chrono::steady_clock::now() < deadline) {
    int st = 0;
    if (::waitpid(record_, &st, WNOHANG) == record_) {
      record_ = -1;
      FAIL() << "kvm record ended before the guest did: " << ReadFile(tmp_ + "/record.out")
             << ReadFile(tmp_ + "/record.err");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(ReadFile(serial), "AAAAA") << ReadFile(tmp_ + "/record.err");

  // The memory tree of that QEMU, through QMP.
  auto text = QmpHumanMonitorCommand(qmp, "info mtree -f");
  ASSERT_TRUE(text) << text.error().message;
  std::ofstream(mtree) << *text;
  EXPECT_NE(text->find("): pcie-mmcfg-mmio"), std::string::npos) << *text;  // the guest's ECAM

  // --qmp while QEMU runs: the shipped capture's COM1 port by QEMU's names; bad sockets.
  const std::string capture =
      std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm/pvm-user64-pio-mmio-hlt.dat";
  Ran live = RunCli({kBin, "kvm", "report", "-i", capture, "--tsc-mhz", "2596", "--event", "ioport",
                     "--qmp", qmp, "--format", "json"},
                    tmp_);
  ASSERT_EQ(live.status, 0) << live.err;
  bool named = false;
  const nlohmann::json live_json = nlohmann::json::parse(live.out);
  for (const auto& row : live_json["all"]["rows"]) {
    if (row["key"] == "0x3f8:POUT") named = row["name"] == "serial.THR";
  }
  EXPECT_TRUE(named) << live.out;
  // kvm live takes the same flag (the guest is halted: nothing to see, the map must load).
  Ran top = RunCli({kBin, "kvm", "live", "--qmp", qmp, "--event", "ioport", "-d", "0.2",
                    "--stop-after", "0.4", "--format", "json"},
                   tmp_);
  EXPECT_EQ(top.status, 0) << top.err;
  Ran not_qmp = RunCli({kBin, "kvm", "report", "-i", capture, "--qmp", hmp}, tmp_);
  EXPECT_EQ(not_qmp.status, 2);
  EXPECT_EQ(not_qmp.err, "exitscope kvm report: --qmp " + hmp +
                             ": not a QMP monitor: it sent 'QEMU 7.2.22 monitor - type 'help' "
                             "for more information' (a QMP greeting expected)\n")
      << "(another QEMU version words its banner differently)";
  Ran none = RunCli({kBin, "kvm", "report", "-i", capture, "--qmp", tmp_ + "/none.sock"}, tmp_);
  EXPECT_EQ(none.status, 2);
  EXPECT_NE(none.err.find("--qmp " + tmp_ + "/none.sock: no QMP socket there"), std::string::npos)
      << none.err;
  Ran both =
      RunCli({kBin, "kvm", "report", "-i", capture, "--qmp", qmp, "--device-map", mtree}, tmp_);
  EXPECT_EQ(both.status, 2);
  EXPECT_NE(both.err.find("--device-map and --qmp exclude each other"), std::string::npos)
      << both.err;

  // Quit QEMU through QMP (it may close before answering); kvm record then ends with it.
  (void)QmpHumanMonitorCommand(qmp, "quit");
  const int rec_status = Wait(record_);
  record_ = -1;
  const std::string rec_out = ReadFile(tmp_ + "/record.out");
  ASSERT_EQ(rec_status, 0) << rec_out << ReadFile(tmp_ + "/record.err");
  EXPECT_NE(rec_out.find("exited with status 0"), std::string::npos) << rec_out;

  Ran report = RunCli({kBin, "kvm", "report", "-i", dat, "--event", "ioport", "--device-map", mtree,
                       "--format", "json"},
                      tmp_);
  ASSERT_EQ(report.status, 0) << report.err;
  const nlohmann::json j = nlohmann::json::parse(report.out);
  uint64_t qemu_io_exits = 0;
  const std::map<std::string, TraceRow> qemu = QemuTraceByPort(ReadFile(trace), &qemu_io_exits);
  ASSERT_FALSE(qemu.empty()) << "QEMU logged no access: " << ReadFile(trace);

  // Every port the kernel saw, named by QEMU's region; as many accesses as QEMU logged.
  std::map<std::string, uint64_t> ours_by_device, qemu_by_device;
  uint64_t to_vmm = 0;
  std::map<std::string, std::string> names;
  for (const auto& row : j["all"]["rows"]) {
    const std::string key = row["key"], name = row["name"];
    const uint64_t samples = row["samples"];
    names[key] = name;
    to_vmm += row["to_vmm"].get<uint64_t>();
    auto it = qemu.find(key);
    ASSERT_NE(it, qemu.end()) << key << " (" << name << ") is in no line of QEMU's trace";
    const std::string& region = it->second.region;
    EXPECT_TRUE(name == region || name.rfind(region + ".", 0) == 0)
        << key << ": exitscope says '" << name << "', QEMU's trace '" << region << "'";
    EXPECT_EQ(samples, it->second.count) << key << " " << name;
    ours_by_device[region] += samples;
  }
  for (const auto& [key, row] : qemu) {
    EXPECT_TRUE(names.count(key)) << "QEMU logged " << key << " (" << row.region
                                  << "), the kernel's trace has no such port";
    qemu_by_device[row.region] += row.count;
  }
  EXPECT_EQ(ours_by_device, qemu_by_device);
  // Accesses that went to QEMU = QEMU's KVM_EXIT_IO count (the 0x70 writes stay in the kernel).
  EXPECT_EQ(to_vmm, qemu_io_exits);

  // And what the guest did, by name (its code above).
  const std::map<std::string, std::string> expected_names = {
      {"0xcf8:POUT", "pci-conf-idx"}, {"0xcfc:POUT", "pci-conf-data"},
      {"0x3fd:PIN", "serial.LSR"},    {"0x80:POUT", "ioport80"},
      {"0x70:POUT", "rtc-index"},     {"0x71:PIN", "rtc"},
      {"0x60:PIN", "i8042-data"},     {"0x300:PIN", "io"},
      {"0x3f8:POUT", "serial.THR"}};
  EXPECT_EQ(names, expected_names) << report.out;
  const std::map<std::string, uint64_t> expected_devices = {
      {"pci-conf-idx", 1}, {"pci-conf-data", 1}, {"serial", 8},     {"ioport80", 4},
      {"rtc-index", 2},    {"rtc", 2},           {"i8042-data", 1}, {"io", 1}};
  EXPECT_EQ(ours_by_device, expected_devices);
  for (const auto& row : j["all"]["rows"]) {
    if (row["key"] == "0x70:POUT") {
      EXPECT_EQ(row["in_kernel"], 2) << "QEMU coalesces 0x70: no exit to QEMU";
      EXPECT_EQ(row["to_vmm"], 0);
    }
  }
}

}  // namespace
}  // namespace exitscope::sources
