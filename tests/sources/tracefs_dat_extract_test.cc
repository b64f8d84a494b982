// The .dat reader on files trace-cmd itself writes here (`trace-cmd extract`, 3.1.6: file
// version 7, zstd, many chunks per CPU; then `trace-cmd convert` to version 6 and to
// uncompressed version 7): every event name's record count must equal what `trace-cmd
// report` prints. The events are trace_marker writes into a tracefs instance of our own
// (instances/exitscope-test-<pid>, removed afterwards; no top-level setting is touched).
// Skips with a printed reason where tracefs or trace-cmd is missing.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "sources/kvm_pairing.h"
#include "sources/tracecmd_dat.h"

namespace exitscope::sources {
namespace {

namespace fs = std::filesystem;
const fs::path kTracefs = "/sys/kernel/tracing";

bool WriteFile(const fs::path& p, const std::string& s) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, s.data(), s.size()) == static_cast<ssize_t>(s.size());
  ::close(fd);
  return ok;
}

// Per event name, from `trace-cmd report FILE` lines ("... [000] 12.345: name: ...").
std::map<std::string, uint64_t> ReportCounts(const std::string& file) {
  std::map<std::string, uint64_t> out;
  FILE* p = popen(("trace-cmd report '" + file + "' 2>/dev/null").c_str(), "r");
  if (p == nullptr) return out;
  char* line = nullptr;
  size_t cap = 0;
  ssize_t n;
  while ((n = getline(&line, &cap, p)) > 0) {
    std::string_view l(line, static_cast<size_t>(n));
    const size_t rb = l.find("] ");
    if (rb == std::string_view::npos) continue;
    const size_t c1 = l.find(": ", rb);
    if (c1 == std::string_view::npos) continue;
    size_t s = c1 + 2;
    while (s < l.size() && l[s] == ' ') ++s;
    const size_t c2 = l.find(':', s);
    if (c2 == std::string_view::npos) continue;
    ++out[std::string(l.substr(s, c2 - s))];
  }
  free(line);
  EXPECT_EQ(pclose(p), 0) << "trace-cmd report " << file;
  return out;
}

struct Read {
  std::map<std::string, uint64_t> counts;
  uint64_t records = 0, chunks = 0;
  int version = 0;
  std::string compression, error;
};
Read ReadDat(const std::string& file) {
  Read r;
  auto dat = TraceCmdDat::Open(file);
  if (!dat) {
    r.error = dat.error().message;
    return r;
  }
  KvmPairer p({}, nullptr);
  if (Status s = (*dat)->ReadAll(&p); !s) r.error = s.error().message;
  for (const DatEventCount& c : (*dat)->event_counts()) r.counts[c.name] += c.count;
  r.records = (*dat)->records_read();
  r.chunks = (*dat)->chunks_read();
  r.version = (*dat)->version();
  r.compression = (*dat)->compression();
  return r;
}

class ExtractTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kTracefs / "instances")) {
      GTEST_SKIP() << "tracefs not mounted at " << kTracefs;
    }
    if (std::system("command -v trace-cmd >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "trace-cmd not installed";
    }
    work_ = fs::path(::testing::TempDir()) / ("exitscope-extract-" + std::to_string(::getpid()));
    fs::create_directories(work_);
  }
  void TearDown() override {
    for (const std::string& n : instances_) {
      std::error_code ec;
      fs::remove(kTracefs / "instances" / n, ec);  // trace-cmd extract may have removed it
    }
    if (!work_.empty()) fs::remove_all(work_);
  }
  // Writes `markers` trace_marker lines from CPU 0 into a fresh instance with `kb` KiB of
  // buffer on CPU 0, then extracts it (trace-cmd's default: v7, zstd) into `out`.
  void Capture(const std::string& tag, uint64_t markers, uint64_t kb, const fs::path& out) {
    const std::string name = "exitscope-test-" + std::to_string(::getpid()) + "-" + tag;
    const fs::path inst = kTracefs / "instances" / name;
    ASSERT_TRUE(fs::create_directory(inst)) << inst;
    instances_.push_back(name);
    ASSERT_TRUE(WriteFile(inst / "per_cpu/cpu0/buffer_size_kb", std::to_string(kb)));
    cpu_set_t old, one;
    sched_getaffinity(0, sizeof(old), &old);
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    const int fd = ::open((inst / "trace_marker").c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    char msg[64];
    for (uint64_t i = 0; i < markers; ++i) {
      const int n = std::snprintf(msg, sizeof(msg), "exitscope marker %llu",
                                  static_cast<unsigned long long>(i));
      ASSERT_EQ(::write(fd, msg, static_cast<size_t>(n)), n);
    }
    ::close(fd);
    sched_setaffinity(0, sizeof(old), &old);
    const std::string cmd =
        "trace-cmd extract -B " + name + " -o '" + out.string() + "' >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void Convert(const fs::path& in, const fs::path& out, int version, const char* comp) {
    const std::string cmd = "trace-cmd convert -i '" + in.string() + "' --file-version " +
                            std::to_string(version) + " --compression " + comp + " -o '" +
                            out.string() + "' >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  void Check(const fs::path& file, int version, const std::string& compression, uint64_t markers) {
    SCOPED_TRACE(file.string());
    const Read got = ReadDat(file.string());
    ASSERT_EQ(got.error, "");
    EXPECT_EQ(got.version, version);
    EXPECT_EQ(got.compression, compression);
    const std::map<std::string, uint64_t> want = ReportCounts(file.string());
    EXPECT_EQ(got.counts, want);
    EXPECT_EQ(got.counts.count("print") ? got.counts.at("print") : 0,
              markers);  // nothing lost in our own instance
    std::printf("%s: v%d %s, %.1f MB, %llu records, %llu %s, counts equal trace-cmd report\n",
                file.filename().c_str(), got.version, got.compression.c_str(),
                static_cast<double>(fs::file_size(file)) / 1e6,
                static_cast<unsigned long long>(got.records),
                static_cast<unsigned long long>(got.chunks),
                compression == "none" ? "pages" : "chunks");
  }
  fs::path work_;
  std::vector<std::string> instances_;
};

// One chunk per CPU: a few thousand events.
TEST_F(ExtractTest, SmallCaptureInEveryVersionAndCompression) {
  const fs::path z = work_ / "small-v7-zstd.dat";
  Capture("small", 3000, 2048, z);
  const fs::path v6 = work_ / "small-v6.dat", v7 = work_ / "small-v7-none.dat";
  Convert(z, v6, 6, "none");
  Convert(z, v7, 7, "none");
  Check(z, 7, "zstd", 3000);
  Check(v6, 6, "none", 3000);
  Check(v7, 7, "none", 3000);
}

// Over 100 MB of CPU data uncompressed, thousands of zstd chunks on CPU 0.
TEST_F(ExtractTest, LargeCaptureWithManyChunks) {
  const uint64_t markers = 2'300'000;
  const fs::path z = work_ / "large-v7-zstd.dat";
  Capture("large", markers, 160 * 1024, z);
  const fs::path v6 = work_ / "large-v6.dat";
  Convert(z, v6, 6, "none");
  EXPECT_GT(fs::file_size(v6), 100'000'000u);
  Check(z, 7, "zstd", markers);
  Check(v6, 6, "none", markers);
}

}  // namespace
}  // namespace exitscope::sources
