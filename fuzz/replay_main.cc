// fuzz/replay_main.cc: runs a fuzz target over files and folders given on the command line,
// without AFL (ctest's fuzz regressions, and replaying a crash under gdb or a sanitizer):
//
//   build/fuzz/dat_replay testdata/fuzz/dat/ testdata/crashes/flip-6GB.dat
//
// Folders are read one level deep, in name order; README files are skipped. Prints one line
// per input; a crash in the target is the test failure. Address space is capped at
// EXITSCOPE_FUZZ_MEM_MB (default 4096, as afl-fuzz -m in scripts/fuzz.sh; not under a
// sanitizer, whose shadow memory needs more), so a memory blow-up fails instead of swapping.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_target.h"

namespace {

int ReplayFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "%s: cannot open\n", path.c_str());
    return 1;
  }
  std::string bytes;
  bytes.resize(exitscope::fuzz::kMaxInputBytes);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  bytes.resize(static_cast<size_t>(in.gcount()));
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  std::printf("%s: ok (%zu bytes)\n", path.c_str(), bytes.size());
  return 0;
}

void CapMemory() {
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  const char* env = std::getenv("EXITSCOPE_FUZZ_MEM_MB");
  const rlim_t mb = env != nullptr ? std::strtoull(env, nullptr, 10) : 4096;
  if (mb == 0) return;
  const rlimit cap{.rlim_cur = mb << 20, .rlim_max = mb << 20};
  ::setrlimit(RLIMIT_AS, &cap);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  CapMemory();
  int failed = 0;
  size_t inputs = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    std::error_code ec;
    if (!std::filesystem::is_directory(arg, ec)) {
      failed |= ReplayFile(arg);
      ++inputs;
      continue;
    }
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(arg, ec)) {
      if (e.is_regular_file() && e.path().filename().string().rfind("README", 0) != 0) {
        files.push_back(e.path());
      }
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      failed |= ReplayFile(f);
      ++inputs;
    }
  }
  std::printf("%zu inputs replayed\n", inputs);
  return failed;
}
