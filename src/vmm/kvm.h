// vmm/kvm.h: thin owners of the /dev/kvm, VM and vCPU file descriptors (x86-64 only).
//
// No in-kernel irqchip is created, so HLT always exits to userspace (KVM_EXIT_HLT) and the
// VMM decides when a halted vCPU wakes (vmm/halt.h).
#pragma once

#include <linux/kvm.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exitscope/status.h"
#include "vmm/vcpu_loop.h"

namespace exitscope::vmm {

class KvmSystem {
 public:
  // Opens `path` and checks the API version (12) and the capabilities the VMM needs.
  // kUnavailable when the device is missing or unusable, with the reason.
  static Result<std::unique_ptr<KvmSystem>> Open(const std::string& path = "/dev/kvm");
  ~KvmSystem();
  int fd() const { return fd_; }
  int api_version() const { return api_; }
  size_t vcpu_mmap_size() const { return mmap_size_; }
  const std::vector<kvm_cpuid_entry2>& supported_cpuid() const { return cpuid_; }
  bool has_immediate_exit() const { return immediate_exit_; }
  bool has_stats_fd() const { return stats_fd_; }

 private:
  KvmSystem() = default;
  int fd_ = -1;
  int api_ = 0;
  size_t mmap_size_ = 0;
  bool immediate_exit_ = false;
  bool stats_fd_ = false;
  std::vector<kvm_cpuid_entry2> cpuid_;
};

class KvmVcpu final : public VcpuControl {
 public:
  ~KvmVcpu() override;
  uint32_t index() const override { return index_; }
  kvm_run* run() override { return run_; }
  int Run() override;
  Result<kvm_regs> GetRegs() override;
  Result<kvm_sregs> GetSregs() override;
  Status SetRegs(const kvm_regs& r);
  Status SetSregs(const kvm_sregs& s);
  // Sets CPUID from the host's supported list, with this vCPU's APIC id.
  Status SetCpuid(const std::vector<kvm_cpuid_entry2>& supported);
  // KVM_GET_STATS_FD (owned by the caller), or an error.
  Result<int> StatsFd();
  int fd() const { return fd_; }

 private:
  friend class KvmVm;
  KvmVcpu() = default;
  int fd_ = -1;
  uint32_t index_ = 0;
  kvm_run* run_ = nullptr;
  size_t mmap_size_ = 0;
};

class KvmVm {
 public:
  static Result<std::unique_ptr<KvmVm>> Create(KvmSystem& kvm);
  ~KvmVm();
  // Registers [gpa, gpa + size) backed by `host` as memory slot `slot`.
  Status SetMemory(uint32_t slot, uint64_t gpa, uint64_t size, void* host);
  Result<std::unique_ptr<KvmVcpu>> CreateVcpu(uint32_t index);
  int fd() const { return fd_; }

 private:
  KvmVm(KvmSystem& kvm) : kvm_(kvm) {}
  KvmSystem& kvm_;
  int fd_ = -1;
};

}  // namespace exitscope::vmm
