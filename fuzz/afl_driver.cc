// fuzz/afl_driver.cc: runs LLVMFuzzerTestOneInput under afl-fuzz, in persistent mode.
//
// Built only with classic `afl-g++` instrumentation (the GCC plugin and clang modes do not
// work on this project's machines, docs/fuzzing.md). Classic mode links no AFL++ runtime, so
// persistent mode comes from fuzz/afl_persistent.c (plain C, uninstrumented): one process
// runs up to 10000 inputs, each read from stdin (afl-fuzz's default; afl-fuzz rewinds the
// file between inputs) or from the file named by argv[1] (`-- ./target @@`).
//
// EXITSCOPE_FUZZ_FORK_PER_INPUT=1 turns persistent mode off (afl-as's own forkserver then
// forks once per input), to measure the difference.
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

#include "afl_persistent.h"
#include "fuzz_target.h"

namespace {

// Reads one whole input (up to kMaxInputBytes) from `fd`: from offset 0 of a file (afl-fuzz
// rewrites the same file for every input), or to the end of a pipe.
size_t ReadInput(int fd, std::vector<uint8_t>& buf) {
  size_t len = 0;
  bool seekable = true;
  while (len < buf.size()) {
    ssize_t n = seekable ? ::pread(fd, buf.data() + len, buf.size() - len, static_cast<off_t>(len))
                         : ::read(fd, buf.data() + len, buf.size() - len);
    if (n < 0 && errno == ESPIPE && len == 0) {
      seekable = false;
      continue;
    }
    if (n <= 0) break;
    len += static_cast<size_t>(n);
  }
  return len;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint8_t> buf(exitscope::fuzz::kMaxInputBytes);
  while (exitscope_afl_loop()) {
    const int fd = argc > 1 ? ::open(argv[1], O_RDONLY | O_CLOEXEC) : 0;
    if (fd < 0) {
      std::perror(argv[1]);
      return 1;
    }
    const size_t len = ReadInput(fd, buf);
    if (fd != 0) ::close(fd);
    LLVMFuzzerTestOneInput(buf.data(), len);
  }
  return 0;
}
