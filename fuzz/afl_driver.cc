// fuzz/afl_driver.cc: runs one LLVMFuzzerTestOneInput per process under afl-fuzz.
//
// Built only with classic `afl-g++` instrumentation (the GCC plugin and clang modes do not
// work on this project's machines, docs/fuzzing.md). Classic mode links no AFL++ runtime, so
// `__AFL_LOOP` and shared-memory test cases are not available: the forkserver that afl-as
// injects forks once per input after startup, and this driver reads that input from stdin
// (afl-fuzz's default) or from the file named by argv[1] (`-- ./target @@`).
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

#include "fuzz_target.h"

int main(int argc, char** argv) {
  const int fd = argc > 1 ? ::open(argv[1], O_RDONLY | O_CLOEXEC) : 0;
  if (fd < 0) {
    std::perror(argv[1]);
    return 1;
  }
  std::vector<uint8_t> buf(exitscope::fuzz::kMaxInputBytes);
  size_t len = 0;
  while (len < buf.size()) {
    const ssize_t n = ::read(fd, buf.data() + len, buf.size() - len);
    if (n <= 0) break;
    len += static_cast<size_t>(n);
  }
  return LLVMFuzzerTestOneInput(buf.data(), len);
}
