// Device maps at scale (issue 28): 100,000 ranges as a text map, as QEMU's `info mtree -f` and
// as a QMP answer, each loaded in a child process under an RLIMIT_AS cap of 1 GiB over what
// the process already had. Before, each range added copied the whole table and kept every
// copy: 4,000 ranges took 2 GB, 16,000 more than the machine had; 100,000 would need about
// 240 GB. The children print the peak RSS per range; the test bounds it at 2 KiB.
#include <gtest/gtest.h>

#include <malloc.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "sources/kvm_device_map.h"

namespace exitscope::sources {
namespace {

constexpr size_t kRanges = 100000;
constexpr size_t kPeakBytesPerRange = 2048;
constexpr uint64_t kBase = 0x100000000ull;
const std::string kEmptyReturn = "{\"return\": {}}\r\n";

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizer = true;  // shadow memory: no RLIMIT_AS, RSS is not ours
#else
constexpr bool kSanitizer = false;
#endif

std::string TextMap() {
  std::string t;
  char line[96];
  for (size_t i = 0; i < kRanges; ++i) {
    std::snprintf(line, sizeof line, "dev%zu x mmio 0x%llx 0x1000\n", i,
                  static_cast<unsigned long long>(kBase + 0x1000 * i));
    t += line;
  }
  return t;
}

// `info mtree -f` with one i/o region of its own name per range, lines ending as `eol`.
std::string MtreeFlat(const char* eol) {
  std::string t = std::string("FlatView #0") + eol + " AS \"memory\", root: system" + eol +
                  " Root memory region: system" + eol;
  char line[128];
  for (size_t i = 0; i < kRanges; ++i) {
    const unsigned long long b = kBase + 0x1000 * i;
    std::snprintf(line, sizeof line, "  %016llx-%016llx (prio 0, i/o): r%zu%s", b, b + 0xfff, i,
                  eol);
    t += line;
  }
  return t;
}

long StatusKiB(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
  }
  return -1;
}

// Runs `load` in a child: address space capped at 1 GiB over the current one, peak RSS
// restarted (clear_refs 5) first. The child exits 0 when `load` succeeded within the bound.
void InChild(const char* what, const std::function<bool()>& load) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!kSanitizer) {
      const long vm_kib = StatusKiB("VmSize:");
      const rlim_t cap = static_cast<rlim_t>(vm_kib) * 1024 + (rlim_t{1} << 30);
      const rlimit lim{cap, cap};
      if (vm_kib < 0 || ::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(3);
    }
    ::malloc_trim(0);
    std::ofstream("/proc/self/clear_refs") << "5";
    const long before = StatusKiB("VmHWM:");
    if (!load()) ::_exit(1);
    const long delta = StatusKiB("VmHWM:") - before;
    std::printf("%s, %zu ranges: peak RSS +%ld KiB, %.0f bytes per range\n", what, kRanges, delta,
                1024.0 * static_cast<double>(delta) / kRanges);
    std::fflush(stdout);
    ::_exit(kSanitizer || static_cast<size_t>(delta) * 1024 < kPeakBytesPerRange * kRanges ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << what << ": the child died (signal " << WTERMSIG(status) << ")";
  EXPECT_NE(WEXITSTATUS(status), 1) << what << ": the load failed";
  EXPECT_NE(WEXITSTATUS(status), 2)
      << what << ": peak RSS over " << kPeakBytesPerRange << " bytes per range";
  EXPECT_NE(WEXITSTATUS(status), 3) << what << ": could not cap the address space";
}

// The loaded map resolves the first, a middle and the last range to the names given.
bool Resolves(const KvmDeviceMap& m, const char* prefix) {
  for (const size_t i : {size_t{0}, kRanges / 2, kRanges - 1}) {
    std::string_view dev, reg;
    if (!m.Resolve(SubKeyKind::kMmio, kBase + 0x1000 * i + 8, 4, AccessDir::kWrite, &dev, &reg) ||
        dev != prefix + std::to_string(i)) {
      std::fprintf(stderr, "range %zu resolves to '%.*s'\n", i, static_cast<int>(dev.size()),
                   dev.data());
      return false;
    }
  }
  return m.device_count() == kRanges;
}

TEST(DeviceMapScale, TextMapOf100kRanges) {
  const std::string text = TextMap();
  InChild("text map", [&] {
    auto m = KvmDeviceMap::Parse(text, "big.map");
    if (!m) std::fprintf(stderr, "%s\n", m.error().message.c_str());
    return m && Resolves(**m, "dev");
  });
}

TEST(DeviceMapScale, QemuMtreeOf100kRanges) {
  const std::string text = MtreeFlat("\n");
  InChild("info mtree -f", [&] {
    auto m = KvmDeviceMap::Parse(text, "mtree.txt");
    if (!m) std::fprintf(stderr, "%s\n", m.error().message.c_str());
    return m && Resolves(**m, "r");
  });
}

TEST(DeviceMapScale, QmpAnswerOf100kRanges) {
  char dir[] = "/tmp/exitscope-qmp-scale-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/qmp.sock";
  // The answer as QEMU sends it: the text, lines ending "\r\n", in one JSON string.
  std::string text = "{\"return\": \"";
  for (const char c : MtreeFlat("\r\n")) {
    if (c == '"' || c == '\\') text += '\\';
    text += c == '\r' ? std::string("\\r") : c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  text += "\"}\r\n";
  const std::string answer = std::move(text);
  InChild("--qmp", [&] {
    const int lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 1) != 0) {
      return false;
    }
    std::thread peer([&] {
      const int c = ::accept(lfd, nullptr, nullptr);
      if (c < 0) return;
      const std::string greeting =
          "{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 22, \"minor\": 2, \"major\": 7}, "
          "\"package\": \"\"}, \"capabilities\": [\"oob\"]}}\r\n";
      (void)!::write(c, greeting.data(), greeting.size());
      std::string in;
      char buf[4096];
      // qmp_capabilities, then human-monitor-command: one reply per line read.
      for (const std::string* reply : {&kEmptyReturn, &answer}) {
        while (in.find('\n') == std::string::npos) {
          const ssize_t n = ::read(c, buf, sizeof buf);
          if (n <= 0) break;
          in.append(buf, static_cast<size_t>(n));
        }
        in.erase(0, in.find('\n') + 1);
        for (size_t off = 0; off < reply->size();) {
          const ssize_t n = ::write(c, reply->data() + off, reply->size() - off);
          if (n <= 0) break;
          off += static_cast<size_t>(n);
        }
      }
      ::close(c);
    });
    auto m = KvmDeviceMap::LoadQmp(path);
    peer.join();
    ::close(lfd);
    if (!m) std::fprintf(stderr, "%s\n", m.error().message.c_str());
    return m && Resolves(**m, "r");
  });
  ::unlink(path.c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace exitscope::sources
