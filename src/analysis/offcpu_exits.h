// analysis/offcpu_exits.h: the slow exits `kvm stat --bpf --stacks` saw from the kernel
// (sources/bpf/bpf_offcpu_stacks.h), symbolized: per exit its thread, times and, per place its
// thread went off the CPU, the kernel and user frames there (docs/kvm-stacks.md). The one
// model the live lines and the final report (table, JSON, HTML, timeline) are written from.
//
//   OffCpuSlowExits kept({.max_exits = 1000});
//   OffCpuSlowExit e = SymbolizeOffCpuExit(raw, sym, /*stuck=*/false);  // as it ends
//   kept.Add(e);                                  // the 1000 slowest are kept, the rest counted
//   kept.SetNotes(sym.notes());                   // why frames stayed addresses
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "exitscope/stack.h"
#include "sources/bpf/bpf_offcpu_stacks.h"

namespace exitscope::analysis {

// One exit as the program kept it, with its sites' frames resolved.
struct OffCpuSlowExit {
  sources::bpf::OffCpuExit exit;    // thread, kind, times, counts; sites longest first
  std::vector<ThreadStack> stacks;  // exit.sites[i]'s kernel and user frames (note: what is
                                    // missing there)
  bool stuck = false;               // still inside when read ("Stuck now"; exit.end_ns 0)
  uint64_t inside_ns() const noexcept { return exit.duration_ns(); }
};

// The exit's kind bits (OS_KIND_*) in words: "kvm_exit, userspace exit".
std::string OffCpuKindText(uint32_t kind);

// Resolves `e`'s frames with `sym` (its notes grow with what could not be resolved).
OffCpuSlowExit SymbolizeOffCpuExit(const sources::bpf::OffCpuExit& e,
                                   sources::bpf::OffCpuSymbolizer& sym, bool stuck);

// The kernel function the site's thread blocked in: the innermost kernel frame that is not
// the scheduler's own ("anon_pipe_read", "do_nanosleep"); null when none is resolved.
const StackFrame* BlockingKernelFrame(const ThreadStack& s);
// The VMM's own innermost user frame: the first resolved user frame whose module is not a
// shared library (no ".so" in its file name); null when none.
const StackFrame* OwnUserFrame(const ThreadStack& s);

struct OffCpuSlowExitsOptions {
  size_t max_exits = 1000;  // the slowest kept (by inside_ns()); the others counted
  uint64_t slow_ns = 0;     // what made them slow (for the report's words)
};

// The run's slow exits, bounded: the `max_exits` slowest, slowest first; the others counted.
class OffCpuSlowExits {
 public:
  explicit OffCpuSlowExits(OffCpuSlowExitsOptions o = {}) : opts_(o) {}
  void Add(OffCpuSlowExit e);
  void SetNotes(std::vector<std::string> notes) { notes_ = std::move(notes); }

  // Slowest first (the longest inside_ns()).
  const std::vector<OffCpuSlowExit>& exits() const noexcept { return exits_; }
  uint64_t seen() const noexcept { return seen_; }
  uint64_t left_out() const noexcept { return seen_ - exits_.size(); }
  const std::vector<std::string>& notes() const noexcept { return notes_; }
  const OffCpuSlowExitsOptions& options() const noexcept { return opts_; }

 private:
  OffCpuSlowExitsOptions opts_;
  std::vector<OffCpuSlowExit> exits_;
  uint64_t seen_ = 0;
  std::vector<std::string> notes_;
};

}  // namespace exitscope::analysis
