// recorder/symbolizer.h: addresses of this process (or of another live one, by pid: the
// kernel-side stacks of `kvm stat --bpf --stacks`) -> function+offset, module, file:line
// (elfutils libdw), demangled (C++, Rust legacy and v0), cached by address. Not public API.
//
// Slow on a module's first lookup (libdw reads its DWARF lazily: tens of ms), then ~0.1 ms a
// frame, so it runs on the watchdog thread, never on a vCPU thread, and keeps every address it
// resolved (bounded: the cache is cleared when it holds kMaxCached).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "exitscope/stack.h"

struct Dwfl;

namespace exitscope::internal {

class Symbolizer {
 public:
  static constexpr size_t kMaxCached = 16384;
  // pid 0: this process; else another live process (its /proc/PID/maps and the ELF files
  // they map: needs permission to read them, as root).
  explicit Symbolizer(pid_t pid = 0) : pid_(pid) {}
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  // Frames for a stack's addresses, innermost first. The first is the interrupted instruction
  // (`first_exact`); the others are return addresses, looked up at ip - 1 (the call).
  std::vector<StackFrame> Resolve(std::span<const uint64_t> ips, bool first_exact);

 private:
  StackFrame Lookup(uint64_t ip, bool exact);
  bool Report();  // (re)reads /proc/PID/maps into libdw

  pid_t pid_ = 0;
  Dwfl* dwfl_ = nullptr;
  bool reported_ = false;
  std::unordered_map<uint64_t, StackFrame> cache_;  // key: ip * 2 + exact
};

// "_ZN9exitscope3vmm8BlockDev5WriteEv" -> "exitscope::vmm::BlockDev::Write()"; Rust legacy
// ("..17h<hash>E", hash dropped) and v0 ("_R...") too; a name that is not mangled is returned
// as it is.
std::string Demangle(const char* name);

}  // namespace exitscope::internal
