// Fuzz target for trace-cmd .dat files (TraceCmdDat): the input is written to a memfd and
// opened by its /proc/self/fd path, since Open takes a path. Open forks a child to parse the
// event formats with libtraceevent (a crash there becomes an error, not a crash here); under
// afl-fuzz that child is a child of the forked test process and is waited for as usual.
// Both readers run: the mapped one (default) and libtracecmd's iterator only when the
// mapped reader accepted the file (the iterator has no isolation from libtracecmd's crashes,
// by design: it is a reference for tests).
#include <unistd.h>

#include <string>

#include "fuzz_target.h"
#include "sources/kvm_pairing.h"
#include "sources/tracecmd_dat.h"

using exitscope::Isa;
using namespace exitscope::sources;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = exitscope::fuzz::MemFile(data, size);
  if (fd < 0) return 0;
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (auto dat = TraceCmdDat::Open(path)) {
    KvmPairer pairer({}, nullptr);
    (void)(*dat)->ReadAll(&pairer);
    (void)(*dat)->event_counts();
  }
  ::close(fd);
  return 0;
}
