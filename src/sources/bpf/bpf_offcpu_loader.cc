// sources/bpf/bpf_offcpu_loader.cc: loading, attaching and reading offcpu_stacks.bpf.c
// (`--stacks` of `kvm stat --bpf`).
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include <fmt/format.h>

#include "sources/bpf/bpf_attach.h"

#include "sources/bpf/bpf_offcpu_stacks.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "offcpu_stacks.skel.h"

namespace exitscope::sources::bpf {

namespace {

uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

bool BpfOffCpuStacksBuilt() noexcept {
  return true;
}

struct BpfOffCpuStacks::Impl {
  offcpu_stacks_bpf* skel = nullptr;
  ring_buffer* ring = nullptr;
  std::vector<std::pair<bpf_program*, std::string>> programs;  // what Attach() attaches
  std::vector<bpf_link*> links;
  std::vector<OffCpuExit> pending;  // filled by the ring buffer's callback
  int ncpus = 1;

  // The raw addresses of a stack id (none when the id is < 0 or gone).
  std::vector<uint64_t> Stack(int32_t id) const {
    std::vector<uint64_t> ips;
    if (id < 0) return ips;
    uint64_t v[OS_STACK_DEPTH] = {};
    const uint32_t key = static_cast<uint32_t>(id);
    if (bpf_map_lookup_elem(bpf_map__fd(skel->maps.os_stacks), &key, v) != 0) return ips;
    for (uint64_t ip : v) {
      if (ip == 0) break;
      ips.push_back(ip);
    }
    return ips;
  }
  OffCpuExit Convert(const os_thread& t, uint64_t now) const {
    OffCpuExit e;
    e.tgid = t.tgid;
    e.tid = t.tid;
    e.kind = t.kind;
    e.start_ns = t.exit_ts;
    e.end_ns = t.end_ts;
    e.now_ns = now;
    e.off_ns = t.off_ns;
    e.switches = t.switches;
    e.other_off_ns = t.other_off_ns;
    e.other_switches = t.other_switches;
    e.stack_drops = t.stack_drops;
    const uint32_t n = std::min<uint32_t>(t.sites, OS_SITES);
    for (uint32_t i = 0; i < n; ++i) {
      const os_site& s = t.site[i];
      OffCpuSite site{.kstack_id = s.kstack,
                      .ustack_id = s.ustack,
                      .kernel = Stack(s.kstack),
                      .user = Stack(s.ustack),
                      .off_ns = s.off_ns,
                      .switches = s.switches,
                      .preempted = s.preempted};
      e.sites.push_back(std::move(site));
    }
    // In flight and off the CPU now: the period in progress, at its own site or a new one.
    if (t.end_ts == 0 && t.off_ts != 0 && now > t.off_ts) {
      const uint64_t d = now - t.off_ts;
      e.off_ns += d;
      auto it = std::find_if(e.sites.begin(), e.sites.end(), [&](const OffCpuSite& s) {
        return s.kstack_id == t.cur_kstack && s.ustack_id == t.cur_ustack;
      });
      if (it == e.sites.end()) {
        e.sites.push_back({.kstack_id = t.cur_kstack,
                           .ustack_id = t.cur_ustack,
                           .kernel = Stack(t.cur_kstack),
                           .user = Stack(t.cur_ustack)});
        it = e.sites.end() - 1;
      }
      it->off_ns += d;
      it->switches += 1;
      it->preempted += t.cur_preempted;
      it->in_progress = true;
    }
    std::stable_sort(e.sites.begin(), e.sites.end(),
                     [](const OffCpuSite& a, const OffCpuSite& b) { return a.off_ns > b.off_ns; });
    return e;
  }
  Status AttachAll() { return AttachPrograms(programs, links); }
  ~Impl() {
    for (bpf_link* l : links) bpf_link__destroy(l);
    if (ring) ring_buffer__free(ring);
    if (skel) offcpu_stacks_bpf__destroy(skel);
  }
};

BpfOffCpuStacks::BpfOffCpuStacks(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpfOffCpuStacks::~BpfOffCpuStacks() = default;

Result<std::unique_ptr<BpfOffCpuStacks>> BpfOffCpuStacks::Open(const BpfOffCpuOptions& options) {
  if (Status st = RequireKernelBtf(); !st) return Propagate(st);
  QuietLibbpf();
  auto impl = std::make_unique<Impl>();
  impl->ncpus = std::max(1, libbpf_num_possible_cpus());
  impl->skel = offcpu_stacks_bpf__open();
  if (impl->skel == nullptr) {
    return Fail(ErrorCode::kUnavailable,
                fmt::format("cannot open the stacks program: {}", std::strerror(errno)));
  }
  os_config cfg{};
  cfg.target_tgid = options.tgid;
  cfg.slow_ns = options.slow_ns;
  std::memcpy(const_cast<os_config*>(&impl->skel->rodata->cfg), &cfg, sizeof cfg);
  uint32_t entries = 1;
  while (entries < std::max<uint32_t>(options.stack_entries, 1)) entries <<= 1;
  bpf_map__set_max_entries(impl->skel->maps.os_stacks, entries);
  if (int err = offcpu_stacks_bpf__load(impl->skel); err != 0) {
    const int e = -err;
    const bool perm = e == EPERM || e == EACCES;
    return Fail(perm ? ErrorCode::kPermission : ErrorCode::kUnavailable,
                fmt::format("the kernel refused the stacks program ({}): {}", std::strerror(e),
                            LibbpfMessage(e)));
  }
  impl->ring = ring_buffer__new(
      bpf_map__fd(impl->skel->maps.os_ended),
      [](void* ctx, void* data, size_t size) -> int {
        auto* self = static_cast<Impl*>(ctx);
        if (size < sizeof(os_thread)) return 0;
        os_thread t;
        std::memcpy(&t, data, sizeof t);
        self->pending.push_back(self->Convert(t, t.end_ts));
        return 0;
      },
      impl.get(), nullptr);
  if (impl->ring == nullptr) {
    return Fail(ErrorCode::kUnavailable,
                fmt::format("cannot open the stacks ring buffer: {}", std::strerror(errno)));
  }
  // sched_switch and KVM_RUN are required; the kvm tracepoints are taken where they exist.
  std::vector<std::string> attached, missing;
  auto* p = impl->skel->progs.os_sched_switch;
  impl->programs.emplace_back(p, "tracepoint sched:sched_switch");
  impl->programs.emplace_back(impl->skel->progs.os_sys_enter_ioctl,
                              "tracepoint syscalls:sys_enter_ioctl");
  attached = {"sched:sched_switch", "syscalls:sys_enter_ioctl"};
  const std::pair<bpf_program*, const char*> kvm[] = {
      {impl->skel->progs.os_kvm_exit, "kvm_exit"},
      {impl->skel->progs.os_kvm_userspace_exit, "kvm_userspace_exit"},
      {impl->skel->progs.os_kvm_entry, "kvm_entry"},
  };
  for (const auto& [prog, name] : kvm) {
    // Try it once: a kernel without the kvm module (or without this tracepoint) refuses.
    bpf_link* l = bpf_program__attach(prog);
    if (l == nullptr) {
      missing.push_back(fmt::format("kvm:{}", name));
      continue;
    }
    bpf_link__destroy(l);
    impl->programs.emplace_back(prog, fmt::format("tracepoint kvm:{}", name));
    attached.push_back(fmt::format("kvm:{}", name));
  }
  if (Status st = impl->AttachAll(); !st) return Propagate(st);
  std::unique_ptr<BpfOffCpuStacks> s(new BpfOffCpuStacks(std::move(impl)));
  s->attached_ = std::move(attached);
  s->missing_ = std::move(missing);
  return s;
}

Status BpfOffCpuStacks::MarkInside(uint32_t tgid, uint32_t tid) {
  os_thread t{};
  t.tgid = tgid;
  t.tid = tid;
  t.kind = OS_KIND_MARKED;
  t.exit_ts = MonotonicNs();
  if (bpf_map_update_elem(bpf_map__fd(impl_->skel->maps.os_threads), &tid, &t, BPF_ANY) != 0) {
    return Fail(ErrorCode::kUnavailable,
                fmt::format("cannot mark thread {}: {}", tid, std::strerror(errno)));
  }
  return {};
}

Result<std::vector<OffCpuExit>> BpfOffCpuStacks::TakeEnded() {
  if (ring_buffer__consume(impl_->ring) < 0) {
    return Fail(ErrorCode::kIo,
                fmt::format("cannot read the stacks ring buffer: {}", std::strerror(errno)));
  }
  std::vector<OffCpuExit> out;
  out.swap(impl_->pending);
  return out;
}

Result<std::vector<OffCpuExit>> BpfOffCpuStacks::InFlight() const {
  const int fd = bpf_map__fd(impl_->skel->maps.os_threads);
  std::vector<OffCpuExit> out;
  const uint64_t now = MonotonicNs();
  uint32_t key = 0, next = 0;
  const uint32_t* prev = nullptr;
  while (bpf_map_get_next_key(fd, prev, &next) == 0) {
    os_thread t{};
    if (bpf_map_lookup_elem(fd, &next, &t) == 0 && t.exit_ts != 0) {
      t.end_ts = 0;
      out.push_back(impl_->Convert(t, now));
    }
    key = next;
    prev = &key;
  }
  std::sort(out.begin(), out.end(), [](const OffCpuExit& a, const OffCpuExit& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.tid < b.tid;
  });
  return out;
}

os_counters BpfOffCpuStacks::Counters() const {
  std::vector<os_counters> per(static_cast<size_t>(impl_->ncpus));
  os_counters sum{};
  const uint32_t zero = 0;
  if (bpf_map_lookup_elem(bpf_map__fd(impl_->skel->maps.os_counters), &zero, per.data()) != 0) {
    return sum;
  }
  for (const os_counters& c : per) {
    sum.threads_full += c.threads_full;
    sum.stack_drops += c.stack_drops;
    sum.ended_dropped += c.ended_dropped;
    sum.ended += c.ended;
    sum.slow += c.slow;
    sum.captures += c.captures;
  }
  return sum;
}

void BpfOffCpuStacks::Detach() noexcept {
  for (bpf_link* l : impl_->links) bpf_link__destroy(l);
  impl_->links.clear();
}

Status BpfOffCpuStacks::Attach() {
  if (!impl_->links.empty()) return {};
  return impl_->AttachAll();
}

}  // namespace exitscope::sources::bpf
