// vmm/kvm_stats.h: KVM binary statistics (KVM_GET_STATS_FD, Documentation/virt/kvm/api.rst
// section 4.133), read from the stats file descriptor of a vCPU (or VM).
//
// File layout (include/uapi/linux/kvm.h):
//   struct kvm_stats_header { flags, name_size, num_desc, id_offset, desc_offset, data_offset }
//   id string (name_size bytes) at id_offset
//   num_desc descriptors at desc_offset, each 16 + name_size bytes:
//     { u32 flags (type | unit | base), s16 exponent, u16 size, u32 offset, u32 bucket_size,
//       char name[name_size] }
//   (16, not sizeof(struct kvm_stats_desc): in C++ some uapi headers make that 20.)
//   data at data_offset + desc.offset: `size` u64 values per descriptor.
// The schema (header + descriptors) is read once; values are re-read with pread each sample.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "exitscope/status.h"

namespace exitscope::vmm {

struct KvmStatDesc {
  std::string name;    // "exits", "halt_exits", ...
  uint32_t flags = 0;  // KVM_STATS_TYPE_* | KVM_STATS_UNIT_* | KVM_STATS_BASE_*
  int16_t exponent = 0;
  uint16_t size = 0;    // number of u64 values (1 for counters; buckets for histograms)
  uint32_t offset = 0;  // from the data block
  uint32_t bucket_size = 0;
  uint32_t type() const { return flags & 0xf; }  // 0 cumulative, 1 instant, 2 peak, 3/4 hist
};

struct KvmStatsSchema {
  std::string id;  // e.g. "kvm-1234/vcpu-0"
  uint32_t data_offset = 0;
  uint64_t data_size = 0;  // bytes of the data block the descriptors reference
  std::vector<KvmStatDesc> descs;
};

// Reads and validates the header and descriptors from `fd` (positional reads only).
// kCorrupt naming `origin` and the offset when the file is truncated or inconsistent.
Result<KvmStatsSchema> ReadKvmStatsSchema(int fd, const std::string& origin);

struct KvmStatValue {
  std::string name;
  uint64_t value = 0;  // first (for counters: only) value
};

// Reads the current value of every single-value stat (histograms are skipped).
Result<std::vector<KvmStatValue>> ReadKvmStats(int fd, const KvmStatsSchema& schema,
                                               const std::string& origin);

}  // namespace exitscope::vmm
