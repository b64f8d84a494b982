// sources/bpf/bpf_kvm_loader.cc: loading, attaching and reading the program of `kvm stat --bpf`
// with libbpf (built when the program is: src/sources/bpf/CMakeLists.txt).
#include "sources/bpf/bpf_kvm_stat.h"

#include <traceevent/event-parse.h>

#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <string_view>
#include <tuple>

#include <fmt/format.h>

#include "base/histogram.h"
#include "sources/bpf/bpf_attach.h"
#include "sources/tracefs_reader.h"
#include "sources/tracefs_session.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>

#include "kvm_stat.skel.h"

namespace exitscope::sources::bpf {

namespace {

// The tracepoints the program reads, in KS_EV_* order.
constexpr const char* kEvents[KS_EV_COUNT] = {
    "kvm_exit",        "kvm_entry",      "kvm_userspace_exit",
    "kvm_fpu",         "kvm_pio",        "kvm_mmio",
    "kvm_msr",         "kvm_hypercall",  "kvm_emulate_insn",
    "vcpu_match_mmio", "kvm_page_fault", "kvm_inj_exception",
    "kvm_cpuid",
};

// Where each KS_F_* field comes from: (event, field name).
struct FieldSpec {
  int event;
  const char* name;
};
constexpr FieldSpec kFields[KS_F_COUNT] = {
    {KS_EV_EXIT, "exit_reason"},
    {KS_EV_EXIT, "isa"},
    {KS_EV_EXIT, "info1"},
    {KS_EV_EXIT, "info2"},
    {KS_EV_EXIT, "vcpu_id"},
    {KS_EV_ENTRY, "vcpu_id"},
    {KS_EV_USERSPACE_EXIT, "reason"},
    {KS_EV_USERSPACE_EXIT, "errno"},
    {KS_EV_FPU, "load"},
    {KS_EV_PIO, "rw"},
    {KS_EV_PIO, "port"},
    {KS_EV_PIO, "size"},
    {KS_EV_MMIO, "type"},
    {KS_EV_MMIO, "len"},
    {KS_EV_MMIO, "gpa"},
    {KS_EV_MSR, "write"},
    {KS_EV_MSR, "ecx"},
    {KS_EV_HYPERCALL, "nr"},
    {KS_EV_EMULATE_INSN, "len"},
    {KS_EV_EMULATE_INSN, "insn"},
    {KS_EV_VCPU_MATCH_MMIO, "gpa"},
    {KS_EV_VCPU_MATCH_MMIO, "write"},
    {KS_EV_PAGE_FAULT, "vcpu_id"},
};

}  // namespace

bool BpfKvmStatBuilt() noexcept {
  return true;
}

namespace {

bpf_program* ProgramFor(kvm_stat_bpf* skel, int event) {
  bpf_program* const progs[KS_EV_COUNT] = {
      skel->progs.ks_kvm_exit,
      skel->progs.ks_kvm_entry,
      skel->progs.ks_kvm_userspace_exit,
      skel->progs.ks_kvm_fpu,
      skel->progs.ks_kvm_pio,
      skel->progs.ks_kvm_mmio,
      skel->progs.ks_kvm_msr,
      skel->progs.ks_kvm_hypercall,
      skel->progs.ks_kvm_emulate_insn,
      skel->progs.ks_vcpu_match_mmio,
      skel->progs.ks_kvm_page_fault,
      skel->progs.ks_kvm_inj_exception,
      skel->progs.ks_kvm_cpuid,
  };
  return progs[event];
}

// The tp_btf program of each event (nullptr: none, the classic tracepoint only) and the
// number of TP_PROTO arguments it expects (-1: reads none, any count), with whether the first
// is a pointer (struct kvm_vcpu *).
struct BtfSpec {
  int args;
  bool vcpu_first;
};
constexpr BtfSpec kBtfSpecs[KS_EV_COUNT] = {
    {0, false}, {2, true}, {2, false}, {1, false}, {5, false},  {4, false},  {4, false},
    {5, false}, {2, true}, {4, false}, {0, false}, {-1, false}, {-1, false},
};

bpf_program* BtfProgramFor(kvm_stat_bpf* skel, int event) {
  bpf_program* const progs[KS_EV_COUNT] = {
      nullptr,  // kvm_exit: reason and info are computed inside the tracepoint
      skel->progs.ks_btf_kvm_entry,
      skel->progs.ks_btf_kvm_userspace_exit,
      skel->progs.ks_btf_kvm_fpu,
      skel->progs.ks_btf_kvm_pio,
      skel->progs.ks_btf_kvm_mmio,
      skel->progs.ks_btf_kvm_msr,
      skel->progs.ks_btf_kvm_hypercall,
      skel->progs.ks_btf_kvm_emulate_insn,
      skel->progs.ks_btf_vcpu_match_mmio,
      nullptr,  // kvm_page_fault: two prototypes across kernels
      skel->progs.ks_btf_kvm_inj_exception,
      skel->progs.ks_btf_kvm_cpuid,
  };
  return progs[event];
}

// Whether the kernel's btf_trace_<event> is the prototype the tp_btf program reads; else why.
bool BtfProtoMatches(const btf* vmlinux, int e, std::string* why) {
  const std::string name = std::string("btf_trace_") + kEvents[e];
  const int id = btf__find_by_name_kind(vmlinux, name.c_str(), BTF_KIND_TYPEDEF);
  if (id < 0) {
    *why = name + " not in the kernel's BTF";
    return false;
  }
  const btf_type* t = btf__type_by_id(vmlinux, btf__type_by_id(vmlinux, id)->type);  // ptr
  if (t == nullptr || !btf_is_ptr(t)) return false;
  const btf_type* proto = btf__type_by_id(vmlinux, t->type);
  if (proto == nullptr || !btf_is_func_proto(proto)) return false;
  const int args = static_cast<int>(btf_vlen(proto)) - 1;  // the first is the probe's data
  const BtfSpec spec = kBtfSpecs[e];
  if (spec.args < 0) return true;
  if (args != spec.args) {
    *why = fmt::format("{} has {} arguments, the program reads {}", name, args, spec.args);
    return false;
  }
  if (spec.vcpu_first) {
    const int a1 = btf__resolve_type(vmlinux, btf_params(proto)[1].type);
    const btf_type* p = a1 < 0 ? nullptr : btf__type_by_id(vmlinux, a1);
    if (p == nullptr || !btf_is_ptr(p)) {
      *why = name + ": the first argument is not struct kvm_vcpu *";
      return false;
    }
  }
  return true;
}

// Iterates a hash map's keys; calls fn(key) for each.
template <typename K, typename Fn>
void ForEachKey(int fd, Fn&& fn) {
  K key{}, next{};
  const void* prev = nullptr;
  while (bpf_map_get_next_key(fd, prev, &next) == 0) {
    fn(next);
    key = next;
    prev = &key;
  }
}

// The kvm-run programs: kvm_fpu's and kvm_userspace_exit's, then the access counters, with
// the event and the KS_SUB_* kind each counts.
struct RunAccess {
  int event;
  int kind;
};
constexpr RunAccess kRunAccesses[] = {{KS_EV_PIO, KS_SUB_PORT},
                                      {KS_EV_MMIO, KS_SUB_MMIO},
                                      {KS_EV_MSR, KS_SUB_MSR},
                                      {KS_EV_HYPERCALL, KS_SUB_HYPERCALL}};
bpf_program* RunProgramFor(kvm_stat_bpf* skel, int event) {
  switch (event) {
    case KS_EV_FPU:
      return skel->progs.ks_run_kvm_fpu;
    case KS_EV_USERSPACE_EXIT:
      return skel->progs.ks_run_kvm_userspace_exit;
    case KS_EV_PIO:
      return skel->progs.ks_run_kvm_pio;
    case KS_EV_MMIO:
      return skel->progs.ks_run_kvm_mmio;
    case KS_EV_MSR:
      return skel->progs.ks_run_kvm_msr;
    case KS_EV_HYPERCALL:
      return skel->progs.ks_run_kvm_hypercall;
    default:
      return nullptr;
  }
}

// Whether kvm_exit never fires here: the vendor module is kvm-pvm (kvm_pvm loaded, neither
// kvm_intel nor kvm_amd, whose VMX / SVM exits fire kvm_exit); else why not.
bool KvmExitNeverFires(std::string* why) {
  const auto loaded = [](const char* m) {
    return ::access((std::string("/sys/module/") + m).c_str(), F_OK) == 0;
  };
  if (loaded("kvm_intel") || loaded("kvm_amd")) {
    *why = "kvm_intel or kvm_amd is loaded (kvm_exit fires)";
    return false;
  }
  if (!loaded("kvm_pvm")) {
    *why = "no kvm_pvm module (kvm_exit may fire)";
    return false;
  }
  return true;
}

}  // namespace

struct BpfKvmStat::Impl {
  kvm_stat_bpf* skel = nullptr;
  std::vector<bpf_link*> links;  // in the order Detach() destroys them
  // What Attach() attaches, in order, and how an error names it ("tp_btf kvm:kvm_fpu").
  std::vector<std::pair<bpf_program*, std::string>> programs;
  // Attaches `programs` in order; the first `kvm_programs` links kept in the reverse order
  // when `reverse` (the kvm-run pairing detaches kvm_userspace_exit first).
  Status AttachAll() {
    if (Status st = AttachPrograms(programs, links); !st) return st;
    if (reverse) std::reverse(links.begin(), links.begin() + static_cast<long>(kvm_programs));
    return {};
  }
  bool reverse = false;
  size_t kvm_programs = 0;
  int stats_fd = -1;
  // The arrays, mmap()ed read-only: ks_thread_slots, ks_slots, ks_rows.
  struct Mapped {
    void* at = nullptr;
    size_t bytes = 0;
  };
  Mapped threads, slots, rows;
  template <typename T>
  const T* Get(const Mapped& m) const {
    return static_cast<const T*>(m.at);
  }
  // Maps array `map` of `n` elements of T; false (errno set) if not possible.
  template <typename T>
  bool Map(bpf_map* map, size_t n, Mapped* out) {
    out->bytes = sizeof(T) * n;
    void* p = ::mmap(nullptr, out->bytes, PROT_READ, MAP_SHARED, bpf_map__fd(map), 0);
    if (p == MAP_FAILED) return false;
    out->at = p;
    return true;
  }
  ~Impl() {
    for (bpf_link* l : links) bpf_link__destroy(l);
    for (Mapped* m : {&threads, &slots, &rows})
      if (m->at != nullptr) ::munmap(m->at, m->bytes);
    if (skel) kvm_stat_bpf__destroy(skel);
    if (stats_fd >= 0) ::close(stats_fd);
  }
};

BpfKvmStat::BpfKvmStat(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpfKvmStat::~BpfKvmStat() = default;

Result<std::unique_ptr<BpfKvmStat>> BpfKvmStat::Open(const BpfKvmOptions& options) {
  if (Status st = RequireKernelBtf(); !st) return Propagate(st);
  auto dir = FindTracefs(options.tracefs_dir);
  if (!dir) return Fail(ErrorCode::kUnavailable, dir.error().message);
  auto tep = TepEvents::Load(*dir, {"kvm"});
  if (!tep) {
    return Fail(ErrorCode::kUnavailable,
                fmt::format("no kvm tracepoints: {}", tep.error().message));
  }

  // The field layout of this kernel, from the format files.
  ks_config cfg{};
  bool have[KS_EV_COUNT] = {};
  for (int e = 0; e < KS_EV_COUNT; ++e) {
    have[e] = tep_find_event_by_name(tep->get(), "kvm", kEvents[e]) != nullptr;
  }
  for (int f = 0; f < KS_F_COUNT; ++f) {
    cfg.offset[f] = -1;
    tep_event* ev = tep_find_event_by_name(tep->get(), "kvm", kEvents[kFields[f].event]);
    if (ev == nullptr) continue;
    tep_format_field* fld = tep_find_field(ev, kFields[f].name);
    if (fld == nullptr) continue;
    const bool array = (fld->flags & TEP_FIELD_IS_ARRAY) != 0;
    if (fld->offset > 4096 || (!array && fld->size > 8) || (array && fld->size < 15)) continue;
    cfg.offset[f] = static_cast<__s16>(fld->offset);
    cfg.size[f] = static_cast<__u8>(array ? 15 : fld->size);
  }
  cfg.target_tgid = options.tgid;
  cfg.follow_children = options.tgid != 0 && options.follow_children;
  if (!have[KS_EV_EXIT] && !have[KS_EV_USERSPACE_EXIT]) {
    return Fail(ErrorCode::kUnavailable,
                "no kvm_exit and no kvm_userspace_exit tracepoint: nothing to pair");
  }

  QuietLibbpf();
  // Which events can use tp_btf here.
  bool btf_ok[KS_EV_COUNT] = {};
  std::string btf_why;
  if (options.attach != BpfAttach::kTracepoint) {
    btf* vmlinux = btf__load_vmlinux_btf();
    if (vmlinux == nullptr) {
      btf_why = fmt::format("cannot read the kernel's BTF: {}", std::strerror(errno));
    } else {
      for (int e = 0; e < KS_EV_COUNT; ++e) {
        std::string why;
        if (have[e] && kBtfSpecs[e].args != 0 && BtfProtoMatches(vmlinux, e, &why)) {
          btf_ok[e] = true;
        } else if (have[e] && !why.empty()) {
          btf_why += (btf_why.empty() ? "" : "; ") + why;
        }
      }
      btf__free(vmlinux);
    }
  }
  // The kvm-run pairing: possible and wanted here? (needs tp_btf on kvm_fpu and on each
  // access event it counts; kAuto: only where kvm_exit never fires.)
  bool run = false;
  std::string run_why;
  if (options.pairing != BpfPairing::kTracepoints) {
    run = true;
    if (options.attach == BpfAttach::kTracepoint) {
      run = false;
      run_why = "it needs tp_btf (--bpf-attach tracepoint)";
    } else if (!have[KS_EV_FPU] || !btf_ok[KS_EV_FPU] || !have[KS_EV_USERSPACE_EXIT] ||
               !btf_ok[KS_EV_USERSPACE_EXIT]) {
      run = false;
      run_why = "no tp_btf kvm_fpu and kvm_userspace_exit here";
    } else if (options.pairing == BpfPairing::kAuto && !KvmExitNeverFires(&run_why)) {
      run = false;
    }
    for (const RunAccess& a : kRunAccesses) {
      if (run && (options.access_kinds & (1u << a.kind)) && have[a.event] && !btf_ok[a.event]) {
        run = false;
        run_why = fmt::format("no tp_btf {} here", kEvents[a.event]);
      }
    }
    if (!run && options.pairing == BpfPairing::kKvmRun) {
      return Fail(ErrorCode::kUnavailable,
                  fmt::format("the kvm-run pairing is not possible here: {}", run_why));
    }
  }
  const auto run_counts = [&](int event) {
    for (const RunAccess& a : kRunAccesses)
      if (a.event == event) return have[event] && (options.access_kinds & (1u << a.kind)) != 0;
    return event == KS_EV_FPU || event == KS_EV_USERSPACE_EXIT;
  };

  auto impl = std::make_unique<Impl>();
  // Opens and loads the object: the kvm-run programs where `run`, else the tracepoint
  // pairing's with tp_btf where `use_btf`; 0 or the load's error.
  auto load = [&](bool use_btf, bool run) -> int {
    if (impl->skel != nullptr) kvm_stat_bpf__destroy(impl->skel);
    g_libbpf_message.clear();
    impl->skel = kvm_stat_bpf__open();
    if (impl->skel == nullptr) return -errno;
    std::memcpy(const_cast<ks_config*>(&impl->skel->rodata->cfg), &cfg, sizeof cfg);
    for (int e = 0; e < KS_EV_COUNT; ++e) {
      const bool btf = use_btf && btf_ok[e];
      bpf_program__set_autoload(ProgramFor(impl->skel, e), !run && have[e] && !btf);
      if (bpf_program* p = BtfProgramFor(impl->skel, e)) bpf_program__set_autoload(p, !run && btf);
      if (bpf_program* p = RunProgramFor(impl->skel, e))
        bpf_program__set_autoload(p, run && run_counts(e));
    }
    bpf_program__set_autoload(impl->skel->progs.ks_fork, cfg.follow_children != 0);
    return kvm_stat_bpf__load(impl->skel);
  };
  bool use_btf = options.attach != BpfAttach::kTracepoint;
  int err = load(use_btf, run);
  if (err != 0 && run && options.pairing == BpfPairing::kAuto && -err != EPERM && -err != EACCES) {
    run_why = fmt::format("kernel refused its program: {}", LibbpfMessage(-err));
    run = false;
    err = load(use_btf, false);
  }
  if (err != 0 && !run && use_btf && options.attach == BpfAttach::kAuto && -err != EPERM &&
      -err != EACCES) {
    btf_why = fmt::format("tp_btf refused: {}", LibbpfMessage(-err));
    use_btf = false;
    err = load(false, false);
  }
  if (err != 0) {
    const int e = -err;
    const bool perm = e == EPERM || e == EACCES;
    std::string why = LibbpfMessage(e);
    return Fail(perm ? ErrorCode::kPermission : ErrorCode::kUnavailable,
                fmt::format("the kernel refused the BPF program ({}): {}", std::strerror(e), why));
  }
  if (!impl->Map<ks_thread>(impl->skel->maps.ks_thread_slots, KS_THREAD_SLOTS, &impl->threads) ||
      !impl->Map<ks_slot>(impl->skel->maps.ks_slots, KS_MAX_KEYS, &impl->slots) ||
      !impl->Map<ks_row>(impl->skel->maps.ks_rows, KS_MAX_ROWS, &impl->rows)) {
    return Fail(ErrorCode::kUnavailable,
                fmt::format("cannot map the BPF arrays: {}", std::strerror(errno)));
  }
  std::vector<std::string> attached, missing;
  std::string on_btf, on_tp;
  // The kvm-run pairing attaches kvm_userspace_exit, where exits start, last and detaches it
  // first: every exit it starts has had its KVM_RUN's kvm_fpu load (where the vCPU is found)
  // and its own access counted, and gets its end (the next load), but for the last read
  // completions. The other order starts exits no load found the vCPU of or ends.
  std::vector<int> order;
  for (int e = 0; e < KS_EV_COUNT; ++e) order.push_back(e);
  if (run) {
    std::stable_partition(order.begin(), order.end(), [](int e) { return e == KS_EV_FPU; });
    std::stable_partition(order.begin(), order.end(),
                          [](int e) { return e != KS_EV_USERSPACE_EXIT; });
  }
  for (const int e : order) {
    if (!have[e]) {
      missing.emplace_back(kEvents[e]);
      continue;
    }
    if (run && !run_counts(e)) continue;
    const bool btf = run || (use_btf && btf_ok[e]);
    impl->programs.emplace_back(
        run   ? RunProgramFor(impl->skel, e)
        : btf ? BtfProgramFor(impl->skel, e)
              : ProgramFor(impl->skel, e),
        fmt::format("{} kvm:{}", btf ? "tp_btf" : "tracepoint", kEvents[e]));
    attached.emplace_back(kEvents[e]);
    (btf ? on_btf : on_tp) += fmt::format(" {}", kEvents[e]);
  }
  impl->reverse = run;  // Detach() order: see above
  impl->kvm_programs = impl->programs.size();
  if (cfg.follow_children) {
    impl->programs.emplace_back(impl->skel->progs.ks_fork, "raw tracepoint sched_process_fork");
  }
  if (Status st = impl->AttachAll(); !st) return Propagate(st);
  std::unique_ptr<BpfKvmStat> out(new BpfKvmStat(std::move(impl)));
  out->attached_ = std::move(attached);
  out->missing_ = std::move(missing);
  out->kvm_run_ = run;
  if (run) {
    out->attachment_ = fmt::format("kvm-run pairing; tp_btf:{}", on_btf);
  } else {
    out->attachment_ =
        fmt::format("tracepoint pairing{}; tp_btf:{}; tracepoint:{}{}",
                    run_why.empty() ? "" : " (kvm-run pairing not used: " + run_why + ")",
                    on_btf.empty() ? " none" : on_btf, on_tp.empty() ? " none" : on_tp,
                    btf_why.empty() ? "" : " (" + btf_why + ")");
  }
  return out;
}

void BpfKvmStat::Detach() noexcept {
  for (bpf_link* l : impl_->links) bpf_link__destroy(l);
  impl_->links.clear();
}

Status BpfKvmStat::Attach() {
  if (!impl_->links.empty()) return {};
  return impl_->AttachAll();
}

Status BpfKvmStat::EnableRunTimeStats() {
  if (impl_->stats_fd >= 0) return {};
  const int fd = bpf_enable_stats(BPF_STATS_RUN_TIME);
  if (fd < 0) {
    return Fail(ErrorCode::kUnavailable,
                fmt::format("BPF run-time statistics: {}", std::strerror(errno)));
  }
  impl_->stats_fd = fd;
  return {};
}

BpfKvmStat::RunTime BpfKvmStat::ProgramRunTime() const {
  RunTime rt;
  std::vector<bpf_program*> progs;
  for (int e = 0; e < KS_EV_COUNT; ++e) {
    progs.push_back(ProgramFor(impl_->skel, e));
    if (bpf_program* p = BtfProgramFor(impl_->skel, e)) progs.push_back(p);
    if (bpf_program* p = RunProgramFor(impl_->skel, e)) progs.push_back(p);
  }
  for (bpf_program* p : progs) {
    const int fd = bpf_program__fd(p);
    if (fd < 0) continue;
    bpf_prog_info info{};
    __u32 len = sizeof info;
    if (bpf_obj_get_info_by_fd(fd, &info, &len) != 0) continue;
    rt.runs += info.run_cnt;
    rt.ns += info.run_time_ns;
  }
  return rt;
}

Result<BpfKvmSnapshot> BpfKvmStat::Read() const {
  BpfKvmSnapshot snap;
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  snap.now_ns = static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + ts.tv_nsec;
  kvm_stat_bpf* skel = impl_->skel;
  const int threads_fd = bpf_map__fd(skel->maps.ks_threads);
  const int counters_fd = bpf_map__fd(skel->maps.ks_counters);
  const int alloc_fd = bpf_map__fd(skel->maps.ks_alloc);

  ks_alloc alloc{};
  __u32 zero = 0;
  if (bpf_map_lookup_elem(alloc_fd, &zero, &alloc) != 0) {
    return Fail(ErrorCode::kIo, fmt::format("reading the BPF maps: {}", std::strerror(errno)));
  }
  const ks_slot* slots = impl_->Get<ks_slot>(impl_->slots);
  const ks_row* rows = impl_->Get<ks_row>(impl_->rows);
  const uint32_t nrows = std::min<uint32_t>(alloc.rows, KS_MAX_ROWS);
  for (uint32_t i = 0; i < std::min<uint32_t>(alloc.slots, KS_MAX_KEYS); ++i) {
    const ks_slot s = slots[i];  // a copy: the program goes on writing
    if (s.key.flags == 0 || s.stats.timed + s.stats.untimed == 0) continue;
    BpfKvmSample out;
    out.key = s.key;
    out.stats = s.stats;
    for (uint32_t r = 0; r < KS_KEY_ROWS; ++r) {
      if (s.row[r] == 0 || s.row[r] > nrows) continue;
      const ks_row& row = rows[s.row[r] - 1];
      for (uint32_t b = 0; b < KS_ROW_BUCKETS; ++b) {
        const uint64_t n = row.n[b];
        if (n != 0 && r * KS_ROW_BUCKETS + b < KS_HIST_BUCKETS)
          out.buckets.emplace_back(r * KS_ROW_BUCKETS + b, n);
      }
    }
    snap.samples.push_back(std::move(out));
  }
  const ks_thread* threads = impl_->Get<ks_thread>(impl_->threads);
  for (size_t i = 0; i < KS_THREAD_SLOTS; ++i) {
    const ks_thread t = threads[i];
    if (t.tid != 0 && t.first_ts != 0) snap.threads.push_back(t);
  }
  ForEachKey<__u32>(threads_fd, [&](const __u32& tid) {
    ks_thread t{};
    if (bpf_map_lookup_elem(threads_fd, &tid, &t) == 0) snap.threads.push_back(t);
  });
  const int ncpu = libbpf_num_possible_cpus();
  if (ncpu <= 0) return Fail(ErrorCode::kInternal, "cannot count the possible CPUs");
  std::vector<ks_counters> per_cpu(static_cast<size_t>(ncpu));
  if (bpf_map_lookup_elem(counters_fd, &zero, per_cpu.data()) != 0) {
    return Fail(ErrorCode::kIo, fmt::format("reading the BPF counters: {}", std::strerror(errno)));
  }
  for (const ks_counters& c : per_cpu) {
    for (int e = 0; e < KS_EV_COUNT; ++e) snap.counters.records[e] += c.records[e];
    snap.counters.completions += c.completions;
    snap.counters.unpaired_exits += c.unpaired_exits;
    snap.counters.entries_without_exit += c.entries_without_exit;
    snap.counters.children_outside_exit += c.children_outside_exit;
    snap.counters.keys_full += c.keys_full;
    snap.counters.buckets_full += c.buckets_full;
    snap.counters.threads_full += c.threads_full;
    snap.counters.no_vcpu += c.no_vcpu;
  }
  for (const ks_thread& t : snap.threads)
    for (int e = 0; e < KS_EV_COUNT; ++e) snap.counters.records[e] += t.records[e];
  if (kvm_run_) SubtractOwnAccesses(&snap);
  return snap;
}

}  // namespace exitscope::sources::bpf
