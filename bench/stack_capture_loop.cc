// The recorder's hot path in a loop, compiled twice into bench/stack_capture_benchmark: once
// with the project's frame pointers, once with -fomit-frame-pointer (bench/recorder.cmake), so
// one run measures what frame pointers cost per exit (docs/stacks.md, "Cost").
#include <cstddef>
#include <cstdint>

#include "exitscope/recorder.h"

void STACK_LOOP_NAME(exitscope::Recorder& r, const uint64_t* addrs, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    r.BeginExit(0, exitscope::ExitKind::kMmio, addrs[i & 4095], 4, exitscope::AccessDir::kWrite, i);
    r.EndExit(0);
  }
}
