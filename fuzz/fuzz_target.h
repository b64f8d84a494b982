// fuzz/fuzz_target.h: the one entry point every fuzz target defines (libFuzzer's), so the
// same target runs under AFL++ (afl_driver.cc), libFuzzer (clang >= 16) and the ctest replay
// (replay_main.cc). A target returns 0 and must never crash, abort, hang or allocate more
// than the input's documented bound; any failure is a bug in the code under test.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace exitscope::fuzz {

// Inputs above this are cut: AFL++ keeps test cases far smaller, and every parser here
// refuses or bounds larger files by itself.
inline constexpr size_t kMaxInputBytes = 1u << 20;

// An in-memory file holding `data` (memfd), for readers that take a path or an fd.
// Returns the fd (close it), or -1.
int MemFile(const uint8_t* data, size_t size) noexcept;

// Aborts with `what` on stderr: an invariant of the code under test broke (AFL++ and ctest
// then see a crash).
[[noreturn]] void InvariantFailed(const char* what) noexcept;

}  // namespace exitscope::fuzz
