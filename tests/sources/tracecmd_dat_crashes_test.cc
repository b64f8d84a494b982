// Regression inputs for the .dat reader (testdata/crashes/, README there): each crashed or
// exhausted `exitscope kvm report` once. Each now gives exactly one stderr line and exit
// status 2, or is read correctly where valid, under an address-space cap (RLIMIT_AS, set in
// the child before exec) so that unbounded allocation fails the test instead of swapping.
// A sweep then cuts and flips the two small valid files: never a signal, status 0 or 2.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "sources/kvm_pairing.h"
#include "sources/tracecmd_dat.h"

namespace exitscope::sources {
namespace {

namespace fs = std::filesystem;
const fs::path kCrashes = fs::path(EXITSCOPE_TESTDATA_DIR) / "crashes";
const std::string kCli = std::string(EXITSCOPE_BINARY_DIR) + "/exitscope";
// The cap: the reader's bound for these small files is far lower (docs/trace-files.md).
constexpr rlim_t kAddressSpaceCap = rlim_t{1} << 30;
// ASan reserves terabytes of shadow address space, so an ASan build (make asan) cannot run
// under an address-space cap: there the cap is left off (ASan itself reports bad accesses),
// and the sweep samples every 20th cut and every 4th flip position, as each case (a fork of
// an instrumented process) costs ~20 times more. The normal build enforces the cap and
// sweeps every cut.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
constexpr size_t kCutStride = kSanitized ? 20 : 1;
constexpr size_t kFlipStrideFactor = kSanitized ? 4 : 1;

void CapAddressSpace() {
  if (kSanitized) return;
  struct rlimit lim {
    kAddressSpaceCap, kAddressSpaceCap
  };
  ::setrlimit(RLIMIT_AS, &lim);
}

struct CliRun {
  int status = -1;  // exit status, or 128 + signal
  bool signaled = false;
  std::string err;
};

CliRun RunCli(const std::vector<std::string>& args) {
  int pipefd[2];
  EXPECT_EQ(::pipe(pipefd), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    CapAddressSpace();
    ::dup2(pipefd[1], 2);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::close(pipefd[0]);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  CliRun r;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof(buf))) > 0) r.err.append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  r.signaled = WIFSIGNALED(st);
  r.status = r.signaled ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
  return r;
}

size_t Lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

uint64_t RecordsIn(const std::string& path) {
  auto dat = TraceCmdDat::Open(path);
  if (!dat) return 0;
  KvmPairer p({}, nullptr);
  if (!(*dat)->ReadAll(&p)) return 0;
  return (*dat)->records_read();
}

TEST(DatCrashes, EveryReproducerGivesOneLineAndStatus2) {
  ASSERT_TRUE(fs::exists(kCli)) << "exitscope binary not built: " << kCli;
  size_t files = 0;
  for (const auto& ent : fs::directory_iterator(kCrashes)) {
    if (ent.path().extension() != ".dat") continue;
    ++files;
    const std::string path = ent.path().string();
    const std::string name = ent.path().filename().string();
    SCOPED_TRACE(name);
    const CliRun r = RunCli({kCli, "kvm", "report", "-i", path});
    EXPECT_FALSE(r.signaled) << r.err;
    if (name.starts_with("valid-") || name.starts_with("base-")) {
      EXPECT_EQ(r.status, 0) << r.err;
      EXPECT_EQ(r.err, "");
      EXPECT_EQ(RecordsIn(path), 90u);  // as `trace-cmd report` counts them
      continue;
    }
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(Lines(r.err), 1u) << r.err;
    EXPECT_NE(r.err.find(path + ": "), std::string::npos) << r.err;
  }
  EXPECT_EQ(files, 12u) << "testdata/crashes/ lost or gained .dat files: update the README";
}

TEST(DatCrashes, DirectoriesAndStreamsAreRefusedByName) {
  ASSERT_TRUE(fs::exists(kCli)) << "exitscope binary not built: " << kCli;
  const CliRun dir = RunCli({kCli, "kvm", "report", "-i", kCrashes.string()});
  EXPECT_EQ(dir.status, 2);
  EXPECT_EQ(Lines(dir.err), 1u) << dir.err;
  EXPECT_NE(dir.err.find("is a directory"), std::string::npos) << dir.err;
  EXPECT_EQ(dir.err.find("empty file"), std::string::npos) << dir.err;

  const std::string fifo = ::testing::TempDir() + "/dat-fifo-" + std::to_string(::getpid());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const CliRun f = RunCli({kCli, "kvm", "report", "-i", fifo});  // must not wait for a writer
  fs::remove(fifo);
  EXPECT_EQ(f.status, 2);
  EXPECT_NE(f.err.find("streams"), std::string::npos) << f.err;
  const CliRun dash = RunCli({kCli, "kvm", "report", "-i", "-"});
  EXPECT_EQ(dash.status, 2);
  EXPECT_NE(dash.err.find("streams are not supported"), std::string::npos) << dash.err;
}

std::string Slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Every truncation of `name`, and flips of every `flip_stride`-th byte (three masks), opened
// and read one after the other in one capped child process: it must get through all of them
// (each case gives status 0 or an error) without dying. Where it dies, the case is named.
void Sweep(const std::string& name, size_t flip_stride) {
  const std::string all = Slurp(kCrashes / name);
  ASSERT_GT(all.size(), 4096u) << "committed file missing: " << name;
  const std::string path =
      ::testing::TempDir() + "/dat-sweep-" + std::to_string(::getpid()) + "-" + name;
  struct Shared {
    uint64_t cases, read_ok, cut, flip_at;
    uint8_t mask;
  };
  auto* sh = static_cast<Shared*>(
      ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(sh, MAP_FAILED);
  *sh = {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    CapAddressSpace();
    const auto one = [&](std::string_view bytes) {
      { std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes; }
      ++sh->cases;
      auto dat = TraceCmdDat::Open(path);
      if (!dat) return;
      KvmPairer p({}, nullptr);
      sh->read_ok += (*dat)->ReadAll(&p).has_value();
    };
    for (size_t cut = 0; cut < all.size(); cut += kCutStride) {
      sh->cut = cut;
      one(std::string_view(all).substr(0, cut));
    }
    sh->cut = all.size();
    std::string b = all;
    for (size_t at = 0; at < all.size(); at += flip_stride * kFlipStrideFactor) {
      for (uint8_t x : {uint8_t{0xff}, uint8_t{0x01}, uint8_t{0x80}}) {
        sh->flip_at = at;
        sh->mask = x;
        b[at] = static_cast<char>(static_cast<uint8_t>(all[at]) ^ x);
        one(b);
        b[at] = all[at];
      }
    }
    ::_exit(0);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  fs::remove(path);
  const std::string where = sh->cut < all.size() ? "cut at " + std::to_string(sh->cut)
                                                 : "byte " + std::to_string(sh->flip_at) + " ^ " +
                                                       std::to_string(sh->mask);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
      << name << ": the reader died (" << (WIFSIGNALED(st) ? strsignal(WTERMSIG(st)) : "exit")
      << ") on " << where;
  EXPECT_GT(sh->read_ok, 0u);
  std::printf("%s: %llu cuts and flips, %llu read without error, none crashed\n", name.c_str(),
              static_cast<unsigned long long>(sh->cases),
              static_cast<unsigned long long>(sh->read_ok));
  ::munmap(sh, sizeof(Shared));
}

TEST(DatCrashes, EveryTruncationAndFlipsOfTheV6FileNeverCrash) {
  Sweep("base-small6.dat", 23);
}
TEST(DatCrashes, EveryTruncationAndFlipsOfTheV7ZstdFileNeverCrash) {
  Sweep("valid-v7-zstd-segv.dat", 13);
}

}  // namespace
}  // namespace exitscope::sources
