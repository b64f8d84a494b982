// Fuzz target for KVM binary stats files (KVM_GET_STATS_FD layout, vmm/kvm_stats.h), read
// from a memfd with positional reads as the VMM reads the real fd.
#include <unistd.h>

#include "fuzz_target.h"
#include "vmm/kvm_stats.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = exitscope::fuzz::MemFile(data, size);
  if (fd < 0) return 0;
  if (auto schema = exitscope::vmm::ReadKvmStatsSchema(fd, "fuzz.stats")) {
    (void)exitscope::vmm::ReadKvmStats(fd, *schema, "fuzz.stats");
  }
  ::close(fd);
  return 0;
}
