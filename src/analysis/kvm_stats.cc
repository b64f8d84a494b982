#include "analysis/kvm_stats.h"

#include <algorithm>

#include <fmt/format.h>

#include "sources/kvm_decode.h"

namespace exitscope::analysis {
namespace {

constexpr std::string_view kClassNames[] = {"vmexit", "userspace", "ioport",
                                            "mmio",   "msr",       "hypercall"};
constexpr std::string_view kClassTitles[] = {"VM-EXIT",     "USERSPACE-EXIT", "IO Port Access",
                                             "MMIO Access", "MSR Access",     "HYPERCALL"};

}  // namespace

std::string_view ToString(KvmEventClass c) noexcept {
  const auto i = static_cast<size_t>(c);
  return i < std::size(kClassNames) ? kClassNames[i] : "vmexit";
}

bool ParseKvmEventClass(std::string_view s, KvmEventClass* out) noexcept {
  for (size_t i = 0; i < std::size(kClassNames); ++i) {
    if (kClassNames[i] == s) {
      *out = static_cast<KvmEventClass>(i);
      return true;
    }
  }
  return false;
}

std::string_view KvmEventTitle(KvmEventClass c) noexcept {
  const auto i = static_cast<size_t>(c);
  return i < std::size(kClassTitles) ? kClassTitles[i] : "VM-EXIT";
}

bool ParseKvmSortKey(std::string_view s, KvmSortKey* out) noexcept {
  static constexpr std::pair<std::string_view, KvmSortKey> kKeys[] = {
      {"sample", KvmSortKey::kSample}, {"time", KvmSortKey::kTime}, {"max", KvmSortKey::kMax},
      {"min", KvmSortKey::kMin},       {"avg", KvmSortKey::kAvg},   {"mean", KvmSortKey::kAvg},
      {"p50", KvmSortKey::kP50},       {"p99", KvmSortKey::kP99},   {"p999", KvmSortKey::kP999},
      {"p99.9", KvmSortKey::kP999},
  };
  for (const auto& [name, key] : kKeys) {
    if (name == s) {
      *out = key;
      return true;
    }
  }
  return false;
}

KvmAggregator::KvmAggregator(KvmAnalysisOptions options)
    : options_(std::move(options)), slow_rule_{.threshold_ns = options_.slow_ns} {
  analysis_.event = options_.event;
  all_ = std::make_unique<ExitGrouper>(&analysis_.all);
}

void KvmAggregator::Reset() {
  vm_groups_.clear();
  vcpu_groups_.clear();
  analysis_ = KvmAnalysis{};
  analysis_.event = options_.event;
  all_ = std::make_unique<ExitGrouper>(&analysis_.all);
}

KvmAnalysis KvmAggregator::TakeAnalysis() {
  KvmAnalysis out = std::move(analysis_);
  Reset();
  return out;
}

bool KvmAggregator::Classify(const ExitEvent& e, RowKey* key) const {
  switch (options_.event) {
    case KvmEventClass::kVmexit:
      key->name = e.reason;
      return true;
    case KvmEventClass::kUserspace:
      if (!e.userspace) return false;
      key->name = e.user_reason.empty() ? e.reason : e.user_reason;
      return true;
    case KvmEventClass::kIoport:
      if (e.subkey_kind != SubKeyKind::kPort) return false;
      key->sub = e.subkey;
      key->dir = static_cast<uint8_t>(e.dir);
      return true;
    case KvmEventClass::kMmio:
      if (e.subkey_kind != SubKeyKind::kMmio) return false;
      key->sub = e.subkey;
      key->dir = static_cast<uint8_t>(e.dir);
      return true;
    case KvmEventClass::kMsr:
      if (e.subkey_kind != SubKeyKind::kMsr) return false;
      key->sub = e.subkey;
      key->dir = static_cast<uint8_t>(e.dir);
      return true;
    case KvmEventClass::kHypercall:
      if (e.reason.starts_with("HC_")) {
        key->name = e.reason;
        return true;
      }
      if (e.subkey_kind == SubKeyKind::kHypercall) {
        key->sub = e.subkey;
        return true;
      }
      return false;
  }
  return false;
}

std::string KvmAggregator::KeyText(const RowKey& key) const {
  const bool write = key.dir == static_cast<uint8_t>(AccessDir::kWrite);
  switch (options_.event) {
    case KvmEventClass::kVmexit:
    case KvmEventClass::kUserspace:
      return std::string(key.name);
    case KvmEventClass::kIoport:
      return fmt::format("{:#x}:{}", key.sub, write ? "POUT" : "PIN");
    case KvmEventClass::kMmio:
      return fmt::format("{:#x}:{}", key.sub, write ? "W" : "R");
    case KvmEventClass::kMsr:
      return fmt::format("{:#x}:{}", key.sub, write ? "W" : "R");
    case KvmEventClass::kHypercall:
      if (!key.name.empty()) return std::string(key.name);
      return fmt::format("nr {:#x}", key.sub);
  }
  return {};
}

std::string KvmAggregator::NameText(const ExitEvent& e) const {
  switch (options_.event) {
    case KvmEventClass::kIoport:
    case KvmEventClass::kMmio:
      if (e.device.empty()) return {};
      return e.reg.empty() ? std::string(e.device) : fmt::format("{}.{}", e.device, e.reg);
    case KvmEventClass::kMsr:
      return std::string(sources::MsrName(static_cast<uint32_t>(e.subkey)));
    case KvmEventClass::kHypercall:
      if (e.reason.starts_with("HC_")) return {};
      return std::string(e.reason);
    default:
      return {};
  }
}

template <class... Batch>
ExitRow& KvmAggregator::Add(ExitGrouper& g, const RowKey& key, const ExitEvent& e,
                            const Batch&... b) {
  ExitRow& row = g.Row(key, [&] { return RowText{KeyText(key), NameText(e)}; });
  g.Add(row, e, b...);
  return row;
}

ExitGrouper& KvmAggregator::VmGroup(int64_t vm) {
  auto [it, inserted] = vm_groups_.try_emplace(vm);
  if (inserted) {
    analysis_.per_vm.push_back(std::make_unique<KvmGroup>());
    analysis_.per_vm.back()->vm = vm;
    it->second = std::make_unique<ExitGrouper>(analysis_.per_vm.back().get());
  }
  return *it->second;
}

ExitGrouper& KvmAggregator::VcpuGroup(int64_t vm, int64_t vcpu) {
  auto [it, inserted] = vcpu_groups_.try_emplace({vm, vcpu});
  if (inserted) {
    analysis_.per_vcpu.push_back(std::make_unique<KvmGroup>());
    analysis_.per_vcpu.back()->vm = vm;
    analysis_.per_vcpu.back()->vcpu = vcpu;
    it->second = std::make_unique<ExitGrouper>(analysis_.per_vcpu.back().get());
  }
  return *it->second;
}

bool KvmAggregator::Counts(const ExitEvent& e) const {
  RowKey key;
  return Keeps(e, &key);
}

bool KvmAggregator::Keeps(const ExitEvent& e, RowKey* key) const {
  const bool exit_class =
      options_.event == KvmEventClass::kVmexit || options_.event == KvmEventClass::kUserspace;
  return !(e.kernel_access && exit_class) && Classify(e, key) &&
         !(options_.vcpu >= 0 && e.vcpu != options_.vcpu) &&
         !(options_.pid >= 0 && e.vm != options_.pid && e.tid != options_.pid);
}

bool KvmAggregator::Admit(const ExitEvent& e, RowKey* key, uint64_t n) {
  const bool keep = Keeps(e, key);
  if (e.kernel_access) {
    analysis_.kernel_accesses_seen += n;
    if (!keep) analysis_.kernel_accesses_skipped += n;
  } else {
    analysis_.exits_seen += n;
    if (!keep) analysis_.exits_filtered += n;
  }
  return keep;
}

bool KvmAggregator::RowOf(const ExitEvent& e, const ExitRow** row, RowKey* key) const {
  if (IsLastExit(e)) {
    *row = last_.row;
    return true;
  }
  if (!Keeps(e, key)) return false;
  *row = all_->Find(*key);  // its text, without formatting it again
  return true;
}

bool KvmAggregator::RowKeyText(const ExitEvent& e, std::string* text) const {
  const ExitRow* row = nullptr;
  RowKey key;
  if (!RowOf(e, &row, &key)) return false;
  *text = row != nullptr ? row->key : KeyText(key);
  return true;
}

bool KvmAggregator::RowKeyView(const ExitEvent& e, std::string_view* text) const {
  if (IsLastExit(e)) {  // the diagnosis's case: asked right after OnExit counted it
    *text = last_.row->key;
    return true;
  }
  const ExitRow* row = nullptr;
  RowKey key;
  if (!RowOf(e, &row, &key)) return false;
  if (row == nullptr) {
    key_text_ = KeyText(key);
    *text = key_text_;
  } else {
    *text = row->key;
  }
  return true;
}

void KvmAggregator::OnExit(const ExitEvent& e) {
  last_.row = nullptr;
  RowKey key;
  if (!Admit(e, &key, 1)) return;
  if (e.end == ExitEnd::kOpenAtEnd) {
    ++analysis_.open_at_end;
    if (analysis_.open_exits.size() < KvmAnalysis::kMaxOpenExitsKept) {
      analysis_.open_exits.emplace_back(e, KeyText(key));
    }
    return;
  }
  last_ = {&e, e.start_ns, e.tid, &Add(*all_, key, e)};
  if (options_.per_vm) Add(VmGroup(e.vm), key, e);
  if (options_.per_vcpu) Add(VcpuGroup(e.vm, e.vcpu), key, e);
  if (slow_rule_.IsSlow(e)) {
    ++analysis_.slow_exits;
    const std::string_view text = last_.row->key;
    if (analysis_.slow.size() < KvmAnalysis::kMaxSlowExitsKept)
      analysis_.slow.emplace_back(e, std::string(text));
    if (options_.on_slow) options_.on_slow(e, text);
  }
}

void KvmAggregator::OnSamples(const ExitEvent& e, const SampleBatch& b) {
  last_.row = nullptr;
  RowKey key;
  if (!Admit(e, &key, b.timed + b.untimed)) return;
  Add(*all_, key, e, b);
  if (options_.per_vm) Add(VmGroup(e.vm), key, e, b);
  if (options_.per_vcpu) Add(VcpuGroup(e.vm, e.vcpu), key, e, b);
}

void KvmAggregator::Finish() {
  auto by_scope = [](const std::unique_ptr<KvmGroup>& a, const std::unique_ptr<KvmGroup>& b) {
    return std::pair(a->vm, a->vcpu) < std::pair(b->vm, b->vcpu);
  };
  std::sort(analysis_.per_vm.begin(), analysis_.per_vm.end(), by_scope);
  std::sort(analysis_.per_vcpu.begin(), analysis_.per_vcpu.end(), by_scope);
}

DiagnosisOptions KvmDiagnosisOptions(const KvmAggregator& agg) {
  DiagnosisOptions o;
  o.slow = agg.slow_rule();
  if (!o.slow.enabled()) o.slow.threshold_ns = kDiagnosisSlowNs;
  o.key = [&agg](const ExitEvent& e, std::string_view* key) { return agg.RowKeyView(e, key); };
  return o;
}

}  // namespace exitscope::analysis
