// sources/bpf/bpf_kvm_maps.cc: what the program's maps hold, checked against the C++ side at
// compile time, and the snapshot arithmetic that needs no libbpf (built with or without the
// program; the loader is bpf_kvm_loader.cc, the build without BPF bpf_kvm_stat_none.cc).
#include "sources/bpf/bpf_kvm_stat.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "base/histogram.h"

namespace exitscope::sources::bpf {

static_assert(KS_HIST_BUCKETS == base::LatencyHistogram::kBuckets,
              "the BPF histogram must use LatencyHistogram's buckets");
static_assert(KS_HIST_SUB_BITS == base::LatencyHistogram::kSubBits);
static_assert(sizeof(ks_key) == 48, "no hidden padding in keys");
static_assert(sizeof(ks_thread) % 8 == 0 && sizeof(ks_slot) % 8 == 0 && sizeof(ks_row) % 8 == 0,
              "mmap()ed arrays: elements are 8-aligned");
static_assert(KS_KEY_ROWS * KS_ROW_BUCKETS >= KS_HIST_BUCKETS);
static_assert((KS_THREAD_SLOTS & (KS_THREAD_SLOTS - 1)) == 0);

void SubtractOwnAccesses(BpfKvmSnapshot* snap) {
  using AccessKey = std::tuple<uint32_t, uint32_t, uint8_t, uint64_t, uint8_t, uint8_t>;
  const auto key_of = [](uint32_t tgid, uint32_t tid, const ks_key& k) {
    return AccessKey{tgid, tid, k.subkind, k.subkey, k.dir, k.size};
  };
  const auto has_hit = [](const ks_key& k) {
    return k.subkind == KS_SUB_PORT || k.subkind == KS_SUB_MMIO || k.subkind == KS_SUB_HYPERCALL;
  };
  std::map<AccessKey, uint64_t> own;
  for (const BpfKvmSample& s : snap->samples) {
    const ks_key& k = s.key;
    if ((k.flags & KS_F_KERNEL_ACCESS) || !(k.flags & KS_F_USERSPACE) || !has_hit(k)) continue;
    own[key_of(k.tgid, k.tid, k)] += s.stats.timed + s.stats.untimed;
  }
  for (const ks_thread& t : snap->threads) {
    if (t.phase != KS_USER_EXIT || t.exit_ts == 0 || !has_hit(t.ev) || t.ev.dir == KS_DIR_READ)
      continue;
    ++own[key_of(t.tgid, t.tid, t.ev)];
  }
  for (BpfKvmSample& s : snap->samples) {
    if (!(s.key.flags & KS_F_KERNEL_ACCESS)) continue;
    const auto it = own.find(key_of(s.key.tgid, s.key.tid, s.key));
    if (it == own.end()) continue;
    const uint64_t n = std::min<uint64_t>(it->second, s.stats.untimed);
    s.stats.untimed -= n;
    it->second -= n;
  }
  std::erase_if(snap->samples, [](const BpfKvmSample& s) {
    return (s.key.flags & KS_F_KERNEL_ACCESS) && s.stats.timed + s.stats.untimed == 0;
  });
}

}  // namespace exitscope::sources::bpf
