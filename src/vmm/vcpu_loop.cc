#include "vmm/vcpu_loop.h"

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <thread>

#include "guests/abi.h"

namespace exitscope::vmm {

std::string_view ToString(VcpuState s) {
  switch (s) {
    case VcpuState::kRunning:
      return "running";
    case VcpuState::kFinished:
      return "finished";
    case VcpuState::kStopped:
      return "stopped";
    case VcpuState::kFatal:
      return "fatal";
  }
  return "?";
}

HaltWaiter::HaltWaiter(uint32_t num_vcpus, uint32_t tick_us)
    : slots_(num_vcpus), tick_us_(tick_us == 0 ? 1 : tick_us) {}

void HaltWaiter::Wait(uint32_t vcpu, const std::atomic<bool>& stop) {
  if (vcpu >= slots_.size()) return;
  Slot& s = slots_[vcpu];
  std::unique_lock lock(s.mu);
  s.cv.wait_for(lock, std::chrono::microseconds(tick_us_),
                [&] { return s.pending || stop.load(std::memory_order_relaxed); });
  s.pending = false;
}

void HaltWaiter::Kick(uint32_t vcpu) {
  if (vcpu >= slots_.size()) return;
  Slot& s = slots_[vcpu];
  {
    std::lock_guard lock(s.mu);
    s.pending = true;
  }
  s.cv.notify_one();
}

void HaltWaiter::KickAll() {
  for (uint32_t i = 0; i < slots_.size(); ++i) Kick(i);
}

void UnassignedLog::Log(IoSpace space, uint64_t addr, uint32_t size, AccessDir dir, uint32_t vcpu,
                        std::string_view what) {
  char line[256];
  std::snprintf(line, sizeof(line),
                "vCPU %u: %s %s %uB at %s 0x%" PRIx64 " (%.*s): %s; logged once per address", vcpu,
                space == IoSpace::kPio ? "PIO" : "MMIO",
                dir == AccessDir::kWrite ? "write" : "read", size,
                space == IoSpace::kPio ? "port" : "address", addr, static_cast<int>(what.size()),
                what.data(), dir == AccessDir::kWrite ? "write dropped" : "read returns all ones");
  log_(line);
}

std::string UnassignedLog::Summary() const {
  const uint64_t n = count(), l = logged();
  return std::to_string(n) + (n == 1 ? " access, " : " accesses, ") + std::to_string(l) +
         (l == 1 ? " address" : " addresses") + " logged, " + std::to_string(overflow()) +
         " not logged (log full; " + std::to_string(capacity()) + " addresses per space)";
}

const VcpuOutcome& VcpuLoop::Run() {
  while (out_.state == VcpuState::kRunning) {
    if (env_.stop != nullptr && env_.stop->load(std::memory_order_acquire)) {
      out_.state = VcpuState::kStopped;
      break;
    }
    const int r = vcpu_.Run();
    if (r == -EINTR || r == -EAGAIN) {
      vcpu_.run()->exit_reason = KVM_EXIT_INTR;
    } else if (r < 0) {
      Fatal(ExitKind::kOther, 0, std::string("KVM_RUN failed: ") + std::strerror(-r));
      break;
    }
    out_.state = HandleExit();
  }
  return out_;
}

VcpuState VcpuLoop::HandleExit() {
  kvm_run* run = vcpu_.run();
  Recorder* rec = env_.recorder;
  ++out_.exits;
  switch (run->exit_reason) {
    case KVM_EXIT_IO:
      ++out_.io_exits;
      return HandleIo(run);
    case KVM_EXIT_MMIO:
      ++out_.mmio_exits;
      return HandleMmio(run);
    case KVM_EXIT_HLT: {
      ++out_.hlt_exits;
      Recorder::ExitScope scope(rec, index_, ExitKind::kHlt);
      if (env_.halt != nullptr && env_.stop != nullptr) env_.halt->Wait(index_, *env_.stop);
      return VcpuState::kRunning;
    }
    case KVM_EXIT_INTR: {
      // A signal interrupted KVM_RUN: a stop kick (immediate_exit) or e.g. SIGUSR1.
      ++out_.intr_exits;
      Recorder::ExitScope scope(rec, index_, ExitKind::kIntr);
      run->immediate_exit = 0;
      if (env_.stop != nullptr && env_.stop->load(std::memory_order_acquire))
        return VcpuState::kStopped;
      return VcpuState::kRunning;
    }
    case KVM_EXIT_SHUTDOWN: {
      std::string detail = "triple fault (KVM_EXIT_SHUTDOWN)";
      if (auto regs = vcpu_.GetRegs()) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), " at rip 0x%llx",
                      static_cast<unsigned long long>(regs->rip));
        detail += buf;
      }
      return Fatal(ExitKind::kShutdown, 0, detail);
    }
    case KVM_EXIT_FAIL_ENTRY: {
      const uint64_t reason = run->fail_entry.hardware_entry_failure_reason;
      char buf[128];
      std::snprintf(buf, sizeof(buf),
                    "VM entry failed (KVM_EXIT_FAIL_ENTRY), hardware reason 0x%llx",
                    static_cast<unsigned long long>(reason));
      return Fatal(ExitKind::kFailEntry, reason, buf);
    }
    case KVM_EXIT_INTERNAL_ERROR: {
      const uint32_t sub = run->internal.suberror;
      std::string detail =
          "KVM internal error (KVM_EXIT_INTERNAL_ERROR), suberror " + std::to_string(sub);
      switch (sub) {
        case KVM_INTERNAL_ERROR_EMULATION:
          detail += " (emulation failure)";
          break;
        case KVM_INTERNAL_ERROR_SIMUL_EX:
          detail += " (exception while delivering one)";
          break;
        case KVM_INTERNAL_ERROR_DELIVERY_EV:
          detail += " (event delivery)";
          break;
      }
      const uint32_t n = std::min<uint32_t>(run->internal.ndata, 16);
      for (uint32_t i = 0; i < n; ++i) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%s0x%llx", i == 0 ? ", data " : " ",
                      static_cast<unsigned long long>(run->internal.data[i]));
        detail += buf;
      }
      return Fatal(ExitKind::kInternalError, sub, detail);
    }
    case KVM_EXIT_SYSTEM_EVENT: {
      const uint32_t type = run->system_event.type;
      Recorder::ExitScope scope(rec, index_, ExitKind::kSystemEvent, type);
      if (type == KVM_SYSTEM_EVENT_CRASH) {
        out_.state = VcpuState::kFatal;
        out_.detail = "guest crash (KVM_EXIT_SYSTEM_EVENT, type CRASH)";
        return VcpuState::kFatal;
      }
      out_.detail = "system event " + std::to_string(type) + " (shutdown/reset requested)";
      return VcpuState::kStopped;
    }
    case KVM_EXIT_DEBUG: {
      Recorder::ExitScope scope(rec, index_, ExitKind::kDebug);
      return VcpuState::kRunning;
    }
    default:
      return Fatal(ExitKind::kOther, run->exit_reason,
                   "unhandled KVM exit reason " + std::to_string(run->exit_reason));
  }
}

VcpuState VcpuLoop::Fatal(ExitKind kind, uint64_t addr, std::string detail) {
  if (env_.recorder != nullptr) {
    env_.recorder->BeginExit(index_, kind, addr);
    env_.recorder->EndExit(index_);
  }
  out_.state = VcpuState::kFatal;
  out_.detail = "vCPU " + std::to_string(index_) + ": " + detail;
  return VcpuState::kFatal;
}

__attribute__((noinline)) void VcpuLoop::InjectDelay(const Resolution& res) {
  if (env_.delays == nullptr || env_.delays->empty()) return;
  bool spin = false;
  const uint64_t ms = env_.delays->DelayFor(res, &spin);
  if (ms == 0) return;
  if (spin) return SpinFor(std::chrono::milliseconds(ms));
  // Sleep in slices so a stopping VM does not wait for a long injected stall to end. Each
  // slice is measured against the deadline, so a slice a signal cuts short (nanosleep returns
  // EINTR even under SA_RESTART: the stack-capture signal, the kick) is slept again, not lost.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until) {
    if (env_.stop != nullptr && env_.stop->load(std::memory_order_relaxed)) return;
    const auto left = until - std::chrono::steady_clock::now();
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(left, std::chrono::milliseconds(20)));
  }
}

// A handler that polls: busy-waits on the vCPU thread (state R, no system call) until the
// deadline or a stop. Its own frame, so a stack capture names it.
__attribute__((noinline)) void VcpuLoop::SpinFor(std::chrono::milliseconds ms) {
  const auto until = std::chrono::steady_clock::now() + ms;
  while (std::chrono::steady_clock::now() < until) {
    if (env_.stop != nullptr && env_.stop->load(std::memory_order_relaxed)) return;
    for (int i = 0; i < 1000; ++i) asm volatile("pause" ::: "memory");
  }
}

void VcpuLoop::Access(IoSpace space, const Resolution& res, uint64_t addr, uint8_t* data,
                      uint32_t size, AccessDir dir, AccessContext& ctx) {
  Device* dev =
      res.assigned() && res.device < env_.devices.size() ? env_.devices[res.device] : nullptr;
  bool handled = false;
  if (dev != nullptr)
    handled = dir == AccessDir::kWrite ? dev->Write(res.offset, data, size, ctx)
                                       : dev->Read(res.offset, data, size, ctx);
  if (handled) return;
  if (dir == AccessDir::kRead) std::memset(data, 0xff, size);
  if (env_.unassigned != nullptr)
    env_.unassigned->Note(space, addr, size, dir, index_, [&] {
      if (dev == nullptr) return std::string("unassigned");
      char b[24];
      std::snprintf(b, sizeof(b), "%llx", static_cast<unsigned long long>(res.offset));
      return "no register at offset 0x" + std::string(b) + " of " +
             env_.bus->DeviceName(res.device);
    });
}

VcpuState VcpuLoop::Finish(const AccessContext& ctx) {
  switch (ctx.request) {
    case VcpuRequest::kNone:
      return VcpuState::kRunning;
    case VcpuRequest::kFinish:
      out_.code = ctx.code;
      return VcpuState::kFinished;
    case VcpuRequest::kFault:
      out_.state = VcpuState::kFatal;
      out_.detail = "vCPU " + std::to_string(index_) + ": " + FaultDetail(ctx.code);
      return VcpuState::kFatal;
  }
  return VcpuState::kRunning;
}

std::string VcpuLoop::FaultDetail(uint32_t vector) {
  static const char* kNames[] = {"#DE", "#DB",  "NMI", "#BP", "#OF", "#BR", "#UD", "#NM",
                                 "#DF", "#CSO", "#TS", "#NP", "#SS", "#GP", "#PF", "#15",
                                 "#MF", "#AC",  "#MC", "#XM", "#VE", "#CP"};
  std::string s = "guest exception ";
  s += vector < std::size(kNames) ? kNames[vector] : "vector " + std::to_string(vector);
  // The CPL0 stub reported it; the interrupt frame is on the stub's stack (rsp).
  const bool has_error = vector == 8 || (vector >= 10 && vector <= 14) || vector == 17 ||
                         vector == 21 || vector == 29 || vector == 30;
  auto regs = vcpu_.GetRegs();
  if (regs && env_.mem != nullptr) {
    uint64_t frame[2] = {0, 0};
    if (env_.mem->Read(regs->rsp, frame, sizeof(frame))) {
      char buf[96];
      if (has_error)
        std::snprintf(buf, sizeof(buf), " at rip 0x%llx, error code 0x%llx",
                      static_cast<unsigned long long>(frame[1]),
                      static_cast<unsigned long long>(frame[0]));
      else
        std::snprintf(buf, sizeof(buf), " at rip 0x%llx",
                      static_cast<unsigned long long>(frame[0]));
      s += buf;
    }
  }
  if (vector == 14)
    if (auto sregs = vcpu_.GetSregs()) {
      char buf[48];
      std::snprintf(buf, sizeof(buf), ", cr2 0x%llx", static_cast<unsigned long long>(sregs->cr2));
      s += buf;
    }
  return s;
}

VcpuState VcpuLoop::HandleIo(kvm_run* run) {
  auto& io = run->io;
  uint8_t* data = reinterpret_cast<uint8_t*>(run) + io.data_offset;
  const uint32_t size = io.size;
  const AccessDir dir = io.direction == KVM_EXIT_IO_OUT ? AccessDir::kWrite : AccessDir::kRead;
  const Resolution res = env_.bus->Lookup(IoSpace::kPio, io.port, size, dir);
  Recorder* rec = env_.recorder;
  if (rec != nullptr)
    rec->BeginExit(index_, ExitKind::kPio, io.port, static_cast<uint8_t>(size), dir,
                   dir == AccessDir::kWrite ? LoadLe(data, size) : 0);
  InjectDelay(res);
  AccessContext ctx;
  ctx.vcpu = index_;
  const uint32_t count = io.count == 0 ? 1 : io.count;  // > 1 for rep ins / outs
  for (uint32_t i = 0; i < count; ++i)
    Access(IoSpace::kPio, res, io.port, data + i * size, size, dir, ctx);
  if (rec != nullptr) {
    if (dir == AccessDir::kRead)
      rec->EndExit(index_, LoadLe(data, size));
    else
      rec->EndExit(index_);
  }
  return Finish(ctx);
}

VcpuState VcpuLoop::HandleMmio(kvm_run* run) {
  auto& m = run->mmio;
  const uint32_t size = m.len > 8 ? 8 : m.len;
  const AccessDir dir = m.is_write ? AccessDir::kWrite : AccessDir::kRead;
  const Resolution res = env_.bus->Lookup(IoSpace::kMmio, m.phys_addr, size, dir);
  Recorder* rec = env_.recorder;
  if (rec != nullptr)
    rec->BeginExit(index_, ExitKind::kMmio, m.phys_addr, static_cast<uint8_t>(size), dir,
                   dir == AccessDir::kWrite ? LoadLe(m.data, size) : 0);
  InjectDelay(res);
  AccessContext ctx;
  ctx.vcpu = index_;
  Access(IoSpace::kMmio, res, m.phys_addr, m.data, size, dir, ctx);
  if (rec != nullptr) {
    if (dir == AccessDir::kRead)
      rec->EndExit(index_, LoadLe(m.data, size));
    else
      rec->EndExit(index_);
  }
  return Finish(ctx);
}

}  // namespace exitscope::vmm
