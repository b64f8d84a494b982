// sources/bpf/offcpu_symbolizer.cc: OffCpuSymbolizer: kernel frames from /proc/kallsyms, user
// frames through recorder/symbolizer.h's libdw symbolizer pointed at the VMM's pid.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "recorder/symbolizer.h"
#include "sources/bpf/bpf_offcpu_stacks.h"

namespace exitscope::sources::bpf {

OffCpuSymbolizer::OffCpuSymbolizer(std::string kallsyms) : kallsyms_path_(std::move(kallsyms)) {}
OffCpuSymbolizer::~OffCpuSymbolizer() = default;

void OffCpuSymbolizer::Note(std::string note) {
  if (noted_.insert(note).second) notes_.push_back(std::move(note));
}

bool OffCpuSymbolizer::LoadKallsyms() {
  if (kallsyms_loaded_) return !ksyms_.empty();
  kallsyms_loaded_ = true;
  std::ifstream in(kallsyms_path_);
  if (!in) {
    Note(fmt::format("kernel frames unresolved: cannot read {}: {}", kallsyms_path_,
                     std::strerror(errno)));
    return false;
  }
  std::string line;
  bool any_address = false;
  while (std::getline(in, line)) {
    // "ffffffff81234560 T anon_pipe_read" or "... t kvm_vcpu_ioctl\t[kvm]"
    std::istringstream ls(line);
    std::string addr, type, name, module;
    if (!(ls >> addr >> type >> name)) continue;
    ls >> module;
    const uint64_t a = std::strtoull(addr.c_str(), nullptr, 16);
    if (a != 0) any_address = true;
    if (type != "T" && type != "t" && type != "W" && type != "w") continue;
    ksyms_.push_back(
        {a, std::move(name), module.empty() ? "[kernel]" : module});  // module: "[kvm]"
  }
  if (!any_address) {
    ksyms_.clear();
    Note(fmt::format(
        "kernel frames unresolved: {} shows no addresses (kptr_restrict; read it as root)",
        kallsyms_path_));
    return false;
  }
  std::sort(ksyms_.begin(), ksyms_.end(),
            [](const KSym& a, const KSym& b) { return a.addr < b.addr; });
  return true;
}

StackFrame OffCpuSymbolizer::Kernel(uint64_t ip) {
  StackFrame f;
  f.ip = ip;
  f.module = "[kernel]";
  if (!LoadKallsyms()) return f;
  auto it = std::upper_bound(ksyms_.begin(), ksyms_.end(), ip,
                             [](uint64_t a, const KSym& s) { return a < s.addr; });
  if (it == ksyms_.begin()) {
    Note(fmt::format("kernel frame 0x{:x} is below every symbol of {}", ip, kallsyms_path_));
    return f;
  }
  --it;
  f.function = it->name;
  f.offset = ip - it->addr;
  f.module = it->module;
  return f;
}

ThreadStack OffCpuSymbolizer::Resolve(uint32_t tgid, uint32_t tid, const OffCpuSite& site) {
  ThreadStack st;
  st.tid = static_cast<int32_t>(tid);
  st.capture = site.switches;
  st.state = site.preempted == site.switches && site.switches != 0 ? 'R' : 0;
  for (uint64_t ip : site.kernel) st.kernel.push_back(Kernel(ip));
  std::vector<std::string> missing;
  if (site.kstack_id < 0) {
    missing.push_back(
        site.kstack_id == -EEXIST
            ? "kernel stack not stored (stack map bucket taken: counted as a drop)"
            : fmt::format("kernel stack not stored ({})", std::strerror(-site.kstack_id)));
  }
  if (site.ustack_id < 0) {
    missing.push_back(
        site.ustack_id == -EEXIST
            ? "user stack not stored (stack map bucket taken: counted as a drop)"
            : fmt::format("user stack not stored ({})", std::strerror(-site.ustack_id)));
  }
  if (!site.user.empty()) {
    auto& sym = user_[tgid];
    if (!sym) sym = std::make_unique<internal::Symbolizer>(static_cast<pid_t>(tgid));
    st.user = sym->Resolve(site.user, true);
    std::string exe;
    {
      char buf[4096];
      const ssize_t n = ::readlink(fmt::format("/proc/{}/exe", tgid).c_str(), buf, sizeof buf - 1);
      if (n > 0) exe = std::string(buf, static_cast<size_t>(n));
    }
    const std::string exe_base =
        exe.empty() ? fmt::format("process {}", tgid) : exe.substr(exe.rfind('/') + 1);
    for (const StackFrame& f : st.user) {
      if (!f.function.empty()) continue;
      if (f.module.empty()) {
        Note(
            fmt::format("{}: user frame 0x{:x} is in no mapping read from /proc/{}/maps (the "
                        "process exited, or the mapping is gone)",
                        exe_base, f.ip, tgid));
      } else {
        const std::string mod = f.module.substr(f.module.rfind('/') + 1);
        Note(
            fmt::format("{}: no symbol covers its frames at addresses like 0x{:x} (no symbol "
                        "table, stripped)",
                        mod, f.ip));
      }
    }
    // The kernel unwinds user stacks by frame pointers: a short chain ends where they end.
    if (st.user.size() <= 2 && site.user.size() < OS_STACK_DEPTH) {
      const StackFrame& last = st.user.back();
      Note(fmt::format(
          "{}: user frames stop at {}: the kernel follows frame pointers, and the code above "
          "keeps none",
          exe_base, last.function.empty() ? fmt::format("0x{:x}", last.ip) : last.function));
    }
  }
  for (size_t i = 0; i < missing.size(); ++i) st.note += (i ? "; " : "") + missing[i];
  return st;
}

}  // namespace exitscope::sources::bpf
