// vmm/vcpu_loop.h: the vCPU run loop: KVM_RUN, then one `switch (run->exit_reason)`.
//
// The KVM calls sit behind VcpuControl so the loop can be driven by a fake kvm_run in tests
// (one test per exit kind, no /dev/kvm needed). Every userspace exit is timed by the recorder
// (when recording): BeginExit as soon as KVM_RUN returns, EndExit once the exit is handled and
// the vCPU is about to re-enter. PIO and MMIO are dispatched through the VMM's bus (an
// exitscope::AddressSpace, the same one the recorder resolves names with); an access to no
// device, or to a device offset with no register, is answered like hardware (reads all ones,
// writes dropped), logged once per address (in fixed memory: UnassignedLog), and the VM keeps
// running.
#pragma once

#include <linux/kvm.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "exitscope/address_space.h"
#include "exitscope/recorder.h"
#include "exitscope/status.h"
#include "exitscope/unassigned_log.h"
#include "vmm/device.h"
#include "vmm/fault_injection.h"
#include "vmm/guest_memory.h"

namespace exitscope::vmm {

// The KVM side of one vCPU.
class VcpuControl {
 public:
  virtual ~VcpuControl() = default;
  virtual uint32_t index() const = 0;
  virtual kvm_run* run() = 0;
  // KVM_RUN: 0, or -errno (-EINTR when a signal or immediate_exit interrupted it).
  virtual int Run() = 0;
  virtual Result<kvm_regs> GetRegs() = 0;
  virtual Result<kvm_sregs> GetSregs() = 0;
};

// Where halted vCPUs wait. There is no irqchip: a halted vCPU wakes at its next tick (a
// 1 kHz timer by default) or earlier when a device "interrupts" it (Kick).
class HaltWaiter {
 public:
  HaltWaiter(uint32_t num_vcpus, uint32_t tick_us);
  // Waits until a kick or the next tick; returns at once when a kick is pending or `stop`.
  void Wait(uint32_t vcpu, const std::atomic<bool>& stop);
  void Kick(uint32_t vcpu);
  void KickAll();

 private:
  struct alignas(64) Slot {
    std::mutex mu;
    std::condition_variable cv;
    bool pending = false;
  };
  std::vector<Slot> slots_;
  uint32_t tick_us_;
};

// Logs an access no device answered (an unassigned address, or a device offset with no
// register) once per (space, address), in fixed memory. A guest chooses these addresses: one
// scanning MMIO touches millions of distinct ones. The "seen" set is the library's
// UnassignedAccessLog (`capacity` addresses per space, allocated here, lock-free, constant
// cost per access); once it is full, further new addresses are counted in overflow() and
// never logged, so a scan costs at most `capacity` log lines and no host memory grows.
class UnassignedLog {
 public:
  static constexpr uint32_t kDefaultCapacity = 4096;
  explicit UnassignedLog(std::function<void(std::string_view)> log,
                         uint32_t capacity = kDefaultCapacity)
      : seen_(capacity), log_(std::move(log)) {}

  // Counts the access; the first time (space, addr) is seen and remembered, builds the log
  // line (`what()` names what is missing there, called only then) and logs it. Returns
  // whether it logged. Safe from any number of vCPU threads.
  template <typename What>
  bool Note(IoSpace space, uint64_t addr, uint32_t size, AccessDir dir, uint32_t vcpu,
            What&& what) {
    if (!seen_.FirstTime(space, addr)) return false;
    if (log_) Log(space, addr, size, dir, vcpu, what());
    return true;
  }

  uint64_t count() const { return seen_.accesses(); }     // every access noted
  uint64_t logged() const { return seen_.remembered(); }  // distinct addresses logged
  uint64_t overflow() const { return seen_.overflow(); }  // accesses never logged: full
  uint32_t capacity() const { return seen_.capacity(); }  // per space
  // "12 accesses, 1 address logged, 0 not logged (log full; 4096 per space)".
  std::string Summary() const;

 private:
  void Log(IoSpace space, uint64_t addr, uint32_t size, AccessDir dir, uint32_t vcpu,
           std::string_view what);

  UnassignedAccessLog seen_;
  std::function<void(std::string_view)> log_;
};

// Everything the loops of one VM share.
struct VcpuEnv {
  const AddressSpace* bus = nullptr;  // device index -> devices[index]
  std::vector<Device*> devices;
  Recorder* recorder = nullptr;  // null: not recording
  ExitDelayInjector* delays = nullptr;
  GuestMemory* mem = nullptr;
  HaltWaiter* halt = nullptr;  // null: HLT returns at once
  UnassignedLog* unassigned = nullptr;
  std::atomic<bool>* stop = nullptr;
};

enum class VcpuState : uint8_t {
  kRunning = 0,
  kFinished,  // the guest reported its result on the debug-exit port
  kStopped,   // the VMM stopped it (duration, another vCPU's fatal error, a signal)
  kFatal,     // triple fault, failed entry, internal error, a guest exception, KVM_RUN error
};
std::string_view ToString(VcpuState s);

struct VcpuOutcome {
  VcpuState state = VcpuState::kRunning;
  uint32_t code = 0;   // kFinished: the guest's result (0 = pass)
  std::string detail;  // kFatal: what happened, one line
  uint64_t exits = 0;  // userspace exits handled
  uint64_t io_exits = 0, mmio_exits = 0, hlt_exits = 0, intr_exits = 0;
};

class VcpuLoop {
 public:
  VcpuLoop(VcpuControl& vcpu, const VcpuEnv& env) : vcpu_(vcpu), env_(env), index_(vcpu.index()) {}

  // Handles the exit ctl.run() describes (KVM_RUN has returned). kRunning = re-enter.
  VcpuState HandleExit();
  // KVM_RUN + HandleExit until the vCPU finishes, fails or is stopped.
  const VcpuOutcome& Run();
  const VcpuOutcome& outcome() const { return out_; }

 private:
  VcpuState HandleIo(kvm_run* run);
  VcpuState HandleMmio(kvm_run* run);
  VcpuState Fatal(ExitKind kind, uint64_t addr, std::string detail);
  // Dispatches one access; fills `data` with all ones for an unanswered read.
  void Access(IoSpace space, const Resolution& res, uint64_t addr, uint8_t* data, uint32_t size,
              AccessDir dir, AccessContext& ctx);
  // The injected exit delay (not inlined: a stack of a vCPU stuck in it names it).
  void InjectDelay(const Resolution& res);
  void SpinFor(std::chrono::milliseconds ms);  // spin: injection (busy-waits)
  VcpuState Finish(const AccessContext& ctx);
  std::string FaultDetail(uint32_t vector);

  VcpuControl& vcpu_;
  const VcpuEnv& env_;
  uint32_t index_;
  VcpuOutcome out_;
};

}  // namespace exitscope::vmm
