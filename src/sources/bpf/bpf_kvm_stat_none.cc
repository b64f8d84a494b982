// sources/bpf/bpf_kvm_stat_none.cc: BpfKvmStat in a build without the BPF program (clang,
// bpftool, libbpf-dev or the host's BTF missing at configure time): every call says so.
#include "sources/bpf/bpf_kvm_stat.h"

namespace exitscope::sources::bpf {

bool BpfKvmStatBuilt() noexcept {
  return false;
}

struct BpfKvmStat::Impl {};
BpfKvmStat::BpfKvmStat(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpfKvmStat::~BpfKvmStat() = default;

Result<std::unique_ptr<BpfKvmStat>> BpfKvmStat::Open(const BpfKvmOptions&) {
  return Fail(ErrorCode::kUnavailable,
              "this exitscope was built without the BPF program (clang, bpftool, libbpf-dev or "
              "/sys/kernel/btf/vmlinux missing at configure time)");
}
Result<BpfKvmSnapshot> BpfKvmStat::Read() const {
  return Fail(ErrorCode::kUnavailable, "built without BPF");
}
void BpfKvmStat::Detach() noexcept {}
Status BpfKvmStat::Attach() {
  return Fail(ErrorCode::kUnavailable, "built without BPF");
}
Status BpfKvmStat::EnableRunTimeStats() {
  return Fail(ErrorCode::kUnavailable, "built without BPF");
}
BpfKvmStat::RunTime BpfKvmStat::ProgramRunTime() const {
  return {};
}
}  // namespace exitscope::sources::bpf
