#include "vmm/kvm.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace exitscope::vmm {

namespace {
std::string Errno() {
  return std::strerror(errno);
}
}  // namespace

Result<std::unique_ptr<KvmSystem>> KvmSystem::Open(const std::string& path) {
  auto k = std::unique_ptr<KvmSystem>(new KvmSystem());
  k->fd_ = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (k->fd_ < 0) return Fail(ErrorCode::kUnavailable, path + " not available (" + Errno() + ")");
  k->api_ = ioctl(k->fd_, KVM_GET_API_VERSION, 0);
  if (k->api_ != KVM_API_VERSION)
    return Fail(ErrorCode::kUnavailable, path + " not available (API version " +
                                             std::to_string(k->api_) + ", need " +
                                             std::to_string(KVM_API_VERSION) + ")");
  if (ioctl(k->fd_, KVM_CHECK_EXTENSION, KVM_CAP_USER_MEMORY) <= 0)
    return Fail(ErrorCode::kUnavailable, path + " not available (no KVM_CAP_USER_MEMORY)");
  const int sz = ioctl(k->fd_, KVM_GET_VCPU_MMAP_SIZE, 0);
  if (sz < static_cast<int>(sizeof(kvm_run)))
    return Fail(ErrorCode::kUnavailable, path + " not available (KVM_GET_VCPU_MMAP_SIZE: " +
                                             (sz < 0 ? Errno() : std::to_string(sz)) + ")");
  k->mmap_size_ = static_cast<size_t>(sz);
  k->immediate_exit_ = ioctl(k->fd_, KVM_CHECK_EXTENSION, KVM_CAP_IMMEDIATE_EXIT) > 0;
#ifdef KVM_CAP_BINARY_STATS_FD
  k->stats_fd_ = ioctl(k->fd_, KVM_CHECK_EXTENSION, KVM_CAP_BINARY_STATS_FD) > 0;
#endif
  for (uint32_t n = 64; n <= 4096; n *= 2) {
    std::vector<uint8_t> buf(sizeof(kvm_cpuid2) + n * sizeof(kvm_cpuid_entry2));
    auto* c = reinterpret_cast<kvm_cpuid2*>(buf.data());
    c->nent = n;
    if (ioctl(k->fd_, KVM_GET_SUPPORTED_CPUID, c) == 0) {
      k->cpuid_.assign(c->entries, c->entries + c->nent);
      break;
    }
    if (errno != E2BIG) break;  // leave CPUID empty: KVM's defaults apply
  }
  return k;
}

KvmSystem::~KvmSystem() {
  if (fd_ >= 0) close(fd_);
}

Result<std::unique_ptr<KvmVm>> KvmVm::Create(KvmSystem& kvm) {
  auto vm = std::unique_ptr<KvmVm>(new KvmVm(kvm));
  for (int attempt = 0; attempt < 10; ++attempt) {
    vm->fd_ = ioctl(kvm.fd(), KVM_CREATE_VM, 0);
    if (vm->fd_ >= 0 || errno != EINTR) break;
  }
  if (vm->fd_ < 0) return Fail(ErrorCode::kUnavailable, "KVM_CREATE_VM failed: " + Errno());
  // VMX needs a 3-page region for the real-mode TSS below 4 GiB; harmless elsewhere. Hosts
  // without it (SVM, PVM) refuse or ignore the call, which is fine.
  (void)ioctl(vm->fd_, KVM_SET_TSS_ADDR, 0xfffbd000ul);
  return vm;
}

KvmVm::~KvmVm() {
  if (fd_ >= 0) close(fd_);
}

Status KvmVm::SetMemory(uint32_t slot, uint64_t gpa, uint64_t size, void* host) {
  kvm_userspace_memory_region r{};
  r.slot = slot;
  r.guest_phys_addr = gpa;
  r.memory_size = size;
  r.userspace_addr = reinterpret_cast<uint64_t>(host);
  if (ioctl(fd_, KVM_SET_USER_MEMORY_REGION, &r) < 0)
    return Fail(ErrorCode::kIo, "KVM_SET_USER_MEMORY_REGION (slot " + std::to_string(slot) + ", " +
                                    std::to_string(size) + " bytes) failed: " + Errno());
  return {};
}

Result<std::unique_ptr<KvmVcpu>> KvmVm::CreateVcpu(uint32_t index) {
  auto v = std::unique_ptr<KvmVcpu>(new KvmVcpu());
  v->index_ = index;
  v->fd_ = ioctl(fd_, KVM_CREATE_VCPU, static_cast<unsigned long>(index));
  if (v->fd_ < 0)
    return Fail(ErrorCode::kIo, "KVM_CREATE_VCPU " + std::to_string(index) + " failed: " + Errno());
  void* p = mmap(nullptr, kvm_.vcpu_mmap_size(), PROT_READ | PROT_WRITE, MAP_SHARED, v->fd_, 0);
  if (p == MAP_FAILED)
    return Fail(ErrorCode::kIo,
                "mmap of vCPU " + std::to_string(index) + " kvm_run failed: " + Errno());
  v->run_ = static_cast<kvm_run*>(p);
  v->mmap_size_ = kvm_.vcpu_mmap_size();
  return v;
}

KvmVcpu::~KvmVcpu() {
  if (run_ != nullptr) munmap(run_, mmap_size_);
  if (fd_ >= 0) close(fd_);
}

int KvmVcpu::Run() {
  if (ioctl(fd_, KVM_RUN, 0) < 0) return -errno;
  return 0;
}

Result<kvm_regs> KvmVcpu::GetRegs() {
  kvm_regs r;
  if (ioctl(fd_, KVM_GET_REGS, &r) < 0) return Fail(ErrorCode::kIo, "KVM_GET_REGS: " + Errno());
  return r;
}

Result<kvm_sregs> KvmVcpu::GetSregs() {
  kvm_sregs s;
  if (ioctl(fd_, KVM_GET_SREGS, &s) < 0) return Fail(ErrorCode::kIo, "KVM_GET_SREGS: " + Errno());
  return s;
}

Status KvmVcpu::SetRegs(const kvm_regs& r) {
  if (ioctl(fd_, KVM_SET_REGS, &r) < 0) return Fail(ErrorCode::kIo, "KVM_SET_REGS: " + Errno());
  return {};
}

Status KvmVcpu::SetSregs(const kvm_sregs& s) {
  if (ioctl(fd_, KVM_SET_SREGS, &s) < 0) return Fail(ErrorCode::kIo, "KVM_SET_SREGS: " + Errno());
  return {};
}

Status KvmVcpu::SetCpuid(const std::vector<kvm_cpuid_entry2>& supported) {
  if (supported.empty()) return {};
  std::vector<uint8_t> buf(sizeof(kvm_cpuid2) + supported.size() * sizeof(kvm_cpuid_entry2));
  auto* c = reinterpret_cast<kvm_cpuid2*>(buf.data());
  c->nent = static_cast<uint32_t>(supported.size());
  for (size_t i = 0; i < supported.size(); ++i) {
    kvm_cpuid_entry2 e = supported[i];
    if (e.function == 1) e.ebx = (e.ebx & 0x00ffffff) | (index_ << 24);  // initial APIC id
    if (e.function == 0xb || e.function == 0x1f) e.edx = index_;         // x2APIC id
    c->entries[i] = e;
  }
  if (ioctl(fd_, KVM_SET_CPUID2, c) < 0) return Fail(ErrorCode::kIo, "KVM_SET_CPUID2: " + Errno());
  return {};
}

Result<int> KvmVcpu::StatsFd() {
#ifdef KVM_GET_STATS_FD
  const int fd = ioctl(fd_, KVM_GET_STATS_FD, 0);
  if (fd < 0) return Fail(ErrorCode::kUnavailable, "KVM_GET_STATS_FD: " + Errno());
  return fd;
#else
  return Fail(ErrorCode::kUnavailable, "KVM_GET_STATS_FD not in this kernel's headers");
#endif
}

}  // namespace exitscope::vmm
