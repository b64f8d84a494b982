// analysis/offcpu_exits.cc: the kernel-seen slow exits, symbolized and bounded
// (offcpu_exits.h).
#include "analysis/offcpu_exits.h"

#include <algorithm>
#include <string_view>

namespace exitscope::analysis {

std::string OffCpuKindText(uint32_t kind) {
  std::string s;
  if (kind & OS_KIND_KERNEL) s += "kvm_exit";
  if (kind & OS_KIND_USERSPACE) s += s.empty() ? "userspace exit" : ", userspace exit";
  if (kind & OS_KIND_MARKED) s += s.empty() ? "marked" : ", marked";
  return s.empty() ? "exit" : s;
}

OffCpuSlowExit SymbolizeOffCpuExit(const sources::bpf::OffCpuExit& e,
                                   sources::bpf::OffCpuSymbolizer& sym, bool stuck) {
  OffCpuSlowExit x{.exit = e, .stacks = {}, .stuck = stuck};
  for (const sources::bpf::OffCpuSite& s : e.sites)
    x.stacks.push_back(sym.Resolve(e.tgid, e.tid, s));
  return x;
}

const StackFrame* BlockingKernelFrame(const ThreadStack& s) {
  for (const StackFrame& f : s.kernel) {
    if (f.function.empty() || f.function.find("schedule") != std::string::npos) continue;
    return &f;
  }
  return nullptr;
}

const StackFrame* OwnUserFrame(const ThreadStack& s) {
  for (const StackFrame& f : s.user) {
    if (f.function.empty()) continue;
    const std::string_view base = std::string_view(f.module).substr(f.module.rfind('/') + 1);
    if (base.find(".so") == std::string_view::npos) return &f;
  }
  return nullptr;
}

void OffCpuSlowExits::Add(OffCpuSlowExit e) {
  ++seen_;
  if (opts_.max_exits == 0) return;
  if (exits_.size() == opts_.max_exits && exits_.back().inside_ns() >= e.inside_ns()) return;
  auto at =
      std::upper_bound(exits_.begin(), exits_.end(), e.inside_ns(),
                       [](uint64_t ns, const OffCpuSlowExit& k) { return ns > k.inside_ns(); });
  exits_.insert(at, std::move(e));
  if (exits_.size() > opts_.max_exits) exits_.pop_back();
}

}  // namespace exitscope::analysis
