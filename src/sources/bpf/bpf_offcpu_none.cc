// sources/bpf/bpf_offcpu_none.cc: BpfOffCpuStacks in a build without the BPF program: every
// call says so (`--stacks` is then refused).
#include "sources/bpf/bpf_offcpu_stacks.h"

namespace exitscope::sources::bpf {

bool BpfOffCpuStacksBuilt() noexcept {
  return false;
}

struct BpfOffCpuStacks::Impl {};
BpfOffCpuStacks::BpfOffCpuStacks(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpfOffCpuStacks::~BpfOffCpuStacks() = default;

Result<std::unique_ptr<BpfOffCpuStacks>> BpfOffCpuStacks::Open(const BpfOffCpuOptions&) {
  return Fail(ErrorCode::kUnavailable,
              "this exitscope was built without the BPF program (clang, bpftool, libbpf-dev or "
              "/sys/kernel/btf/vmlinux missing at configure time)");
}
Status BpfOffCpuStacks::MarkInside(uint32_t, uint32_t) {
  return Fail(ErrorCode::kUnavailable, "built without BPF");
}
Result<std::vector<OffCpuExit>> BpfOffCpuStacks::TakeEnded() {
  return Fail(ErrorCode::kUnavailable, "built without BPF");
}
Result<std::vector<OffCpuExit>> BpfOffCpuStacks::InFlight() const {
  return Fail(ErrorCode::kUnavailable, "built without BPF");
}
os_counters BpfOffCpuStacks::Counters() const {
  return {};
}
void BpfOffCpuStacks::Detach() noexcept {}
Status BpfOffCpuStacks::Attach() {
  return Fail(ErrorCode::kUnavailable, "built without BPF");
}

}  // namespace exitscope::sources::bpf
