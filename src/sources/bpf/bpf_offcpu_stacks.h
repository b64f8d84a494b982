// sources/bpf/bpf_offcpu_stacks.h: `--stacks` of `exitscope kvm stat --bpf`: loads
// offcpu_stacks.bpf.c, which keeps, for each thread inside a KVM exit, the kernel and user
// stacks where it went off the CPU and how long it stayed off (docs/kvm-stacks.md).
//
//   auto s = BpfOffCpuStacks::Open({.tgid = vmm_pid, .slow_ns = 20'000'000});
//   if (!s) ... one line: not built, no permission, the kernel refused the program
//   auto ended = (*s)->TakeEnded();   // every interval: the slow exits that ended since
//   auto stuck = (*s)->InFlight();    // the threads inside an exit now
//   OffCpuSymbolizer sym;  sym.Resolve(exit.tgid, site) -> ThreadStack (kernel, user frames)
//
// Inside an exit: kvm_exit (VMX/SVM) or kvm_userspace_exit until kvm_entry or the thread's
// next ioctl(KVM_RUN). A thread already off the CPU when the program attached is seen only
// from its next switch.
#pragma once

#include <linux/types.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "exitscope/stack.h"
#include "exitscope/status.h"

extern "C" {
#include "sources/bpf/offcpu_stacks_abi.h"
}

namespace exitscope::internal {
class Symbolizer;
}

namespace exitscope::sources::bpf {

struct BpfOffCpuOptions {
  uint32_t tgid = 0;                           // only this process's threads; 0: every process
  uint64_t slow_ns = 20'000'000;               // exits this long or longer are reported
  uint32_t stack_entries = OS_DEFAULT_STACKS;  // the stack map's size (rounded to a power of 2)
};

// One place a thread went off the CPU during an exit: its stacks (raw addresses, innermost
// first) and the time off the CPU from there.
struct OffCpuSite {
  int32_t kstack_id = -1, ustack_id = -1;  // < 0: not stored (-errno of bpf_get_stackid)
  std::vector<uint64_t> kernel, user;
  uint64_t off_ns = 0;
  uint32_t switches = 0;
  uint32_t preempted = 0;    // of which runnable when switched out (preempted, not blocked)
  bool in_progress = false;  // InFlight(): the thread is off the CPU from here now
};

// One exit: ended (TakeEnded) or in flight (InFlight: end_ns == 0).
struct OffCpuExit {
  uint32_t tgid = 0, tid = 0;
  uint32_t kind = 0;                  // OS_KIND_*
  uint64_t start_ns = 0, end_ns = 0;  // CLOCK_MONOTONIC
  uint64_t now_ns = 0;                // InFlight(): when read
  uint64_t off_ns = 0;                // off the CPU in total (with the period in progress)
  uint32_t switches = 0;
  uint64_t other_off_ns = 0;  // periods whose stacks found no site (OS_SITES per exit)
  uint32_t other_switches = 0;
  uint32_t stack_drops = 0;
  std::vector<OffCpuSite> sites;  // longest off-CPU time first
  uint64_t duration_ns() const noexcept { return (end_ns != 0 ? end_ns : now_ns) - start_ns; }
};

// True when this binary has the program (as BpfKvmStatBuilt()).
bool BpfOffCpuStacksBuilt() noexcept;

class BpfOffCpuStacks {
 public:
  // Loads and attaches (sched_switch, syscalls:sys_enter_ioctl, and the kvm tracepoints this
  // kernel has). Errors: kUnavailable (not built, the kernel refused the program, no
  // sched_switch), kPermission.
  static Result<std::unique_ptr<BpfOffCpuStacks>> Open(const BpfOffCpuOptions& options);
  ~BpfOffCpuStacks();
  BpfOffCpuStacks(const BpfOffCpuStacks&) = delete;
  BpfOffCpuStacks& operator=(const BpfOffCpuStacks&) = delete;

  // Marks a thread as inside an exit from now, through the program's map (see
  // offcpu_stacks_abi.h): for tests on hosts where no kvm tracepoint fires.
  Status MarkInside(uint32_t tgid, uint32_t tid);
  // The slow exits that ended since the last call (drains the ring buffer).
  Result<std::vector<OffCpuExit>> TakeEnded();
  // The threads inside an exit now, the period in progress included.
  Result<std::vector<OffCpuExit>> InFlight() const;
  os_counters Counters() const;  // summed over CPUs
  void Detach() noexcept;
  Status Attach();
  // "kvm:kvm_exit", ... attached; and those this kernel lacks.
  const std::vector<std::string>& attached() const noexcept { return attached_; }
  const std::vector<std::string>& missing() const noexcept { return missing_; }

 private:
  struct Impl;
  explicit BpfOffCpuStacks(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> attached_, missing_;
};

// Symbolizes off-CPU sites: kernel frames from /proc/kallsyms, user frames from the process's
// ELF symbols and DWARF (elfutils libdw, read while the process lives). User frames are
// cached per (ELF build-id, file offset): a second process mapping the same binary (QEMU
// restarted, two VMs) reuses them without reading its DWARF again; frames of a module without
// a build-id are cached per process and address. A frame that cannot be resolved keeps its
// address with an empty function; why is said once per cause in notes().
class OffCpuSymbolizer {
 public:
  explicit OffCpuSymbolizer(std::string kallsyms = "/proc/kallsyms");
  ~OffCpuSymbolizer();
  OffCpuSymbolizer(const OffCpuSymbolizer&) = delete;
  OffCpuSymbolizer& operator=(const OffCpuSymbolizer&) = delete;

  // tid, kernel and user frames of one site; ThreadStack::note says what is missing there.
  ThreadStack Resolve(uint32_t tgid, uint32_t tid, const OffCpuSite& site);
  // The reasons frames could not be resolved, each once ("qemu-system-x86_64: user stack
  // stops at ioctl+0x3b: ..."), in the order found.
  const std::vector<std::string>& notes() const noexcept { return notes_; }

  struct CacheStats {
    uint64_t build_id_hits = 0;    // user frames found by (build-id, file offset)
    uint64_t build_id_misses = 0;  // looked up through libdw, then kept by build-id
    uint64_t no_build_id = 0;      // frames of modules without one (or not a file): per process
    uint64_t libdw_sessions = 0;   // processes whose ELF and DWARF libdw had to read
  };
  const CacheStats& cache_stats() const noexcept { return stats_; }
  static constexpr size_t kMaxBuildIdFrames = 65536;  // then the cache is cleared

 private:
  struct Mapping {
    uint64_t start = 0, end = 0, offset = 0;
    std::string path;
    const std::string* build_id = nullptr;  // into build_ids_; null or empty: none
  };
  struct Process {
    std::vector<Mapping> maps;  // /proc/PID/maps, file-backed, sorted by start
    bool read = false;
    std::unique_ptr<internal::Symbolizer> dw;  // created on the first frame it must resolve
  };
  const Mapping* FindMapping(uint32_t tgid, Process& p, uint64_t ip);
  void ReadMaps(uint32_t tgid, Process& p);
  std::vector<StackFrame> ResolveUser(uint32_t tgid, const std::vector<uint64_t>& ips);

  struct KSym {
    uint64_t addr;
    std::string name, module;
  };
  bool LoadKallsyms();
  StackFrame Kernel(uint64_t ip);
  void Note(std::string note);

  std::string kallsyms_path_;
  bool kallsyms_loaded_ = false;
  std::vector<KSym> ksyms_;           // sorted by address; empty when unreadable or hidden
  std::map<uint32_t, Process> user_;  // per tgid
  // "dev:inode" (or the path) -> the module's build-id in hex ("" when it has none).
  std::map<std::string, std::string> build_ids_;
  // (build-id, file offset * 2 + exact) -> the frame (its ip is set per lookup).
  std::map<std::pair<std::string, uint64_t>, StackFrame> by_build_id_;
  CacheStats stats_;
  std::set<std::string> noted_;
  std::vector<std::string> notes_;
};

}  // namespace exitscope::sources::bpf
