#include "analysis/exit_summary.h"

#include <algorithm>
#include <map>

#include "sources/dump_source.h"

namespace exitscope::analysis {
namespace {

void AddSat(uint64_t& sum, uint64_t v) {
  if (__builtin_add_overflow(sum, v, &sum)) sum = UINT64_MAX;
}

}  // namespace

ExitSummaryBuilder::ExitSummaryBuilder(SummaryFilter filter) : filter_(std::move(filter)) {}

bool ExitSummaryBuilder::PassesDevice(std::string_view device) const {
  if (!filter_.device) return true;
  if (*filter_.device == "unassigned") return device.empty();
  return device == *filter_.device;
}

void ExitSummaryBuilder::OnExit(const ExitEvent& e) {
  if (filter_.vcpu && e.vcpu != *filter_.vcpu) return;
  if (!PassesDevice(e.device)) return;
  if (e.end == ExitEnd::kOpenAtEnd || kDumpSlowRule.IsSlow(e)) s_.slow.emplace_back(e);
  if (e.end != ExitEnd::kSeen) return;  // in no table: its time is not known
  ++s_.exits;
  AddSat(s_.total_ns, e.duration_ns);
  if (first_ || e.start_ns < s_.first_ns) s_.first_ns = e.start_ns;
  uint64_t end = e.start_ns;
  AddSat(end, e.duration_ns);
  s_.last_ns = std::max(s_.last_ns, end);
  first_ = false;
  s_.all.Add(e.duration_ns);
  for (auto [key_kind, grouper] :
       {std::pair{ExitKey::kReason, &kinds_}, std::pair{ExitKey::kDevice, &devices_},
        std::pair{ExitKey::kRegister, &registers_}, std::pair{ExitKey::kVcpu, &vcpus_}}) {
    RowKey key;
    if (!KeyOf(key_kind, e, &key, &scratch_)) continue;
    const ExitKey k = key_kind;
    ExitRow& row = grouper->Row(key, [&] { return RowText{KeyText(k, key), {}}; });
    grouper->Add(row, e);
  }
}

void ExitSummaryBuilder::OnDeviceEvent(const DeviceEvent& e) {
  if (e.type != DeviceEventType::kIoSubmit && e.type != DeviceEventType::kIoComplete) return;
  ios_.push_back({e.time_ns, e.type == DeviceEventType::kIoSubmit, std::string(e.device), e.io_id});
}

void ExitSummaryBuilder::OnFinding(const Finding& f) {
  const bool exit_finding = f.type != FindingType::kAgedIo;
  if (exit_finding && filter_.vcpu && f.vcpu != *filter_.vcpu) return;
  if (!PassesDevice(f.device)) return;
  s_.findings.emplace_back(f);
}

ExitSummary ExitSummaryBuilder::Finish() {
  std::stable_sort(s_.slow.begin(), s_.slow.end(),
                   [](const KeptExit& a, const KeptExit& b) { return a.start_ns < b.start_ns; });
  SortInPlace(s_.by_kind, RowOrder::kTime);
  SortInPlace(s_.by_device, RowOrder::kTime);
  SortInPlace(s_.by_register, RowOrder::kTime);
  SortInPlace(s_.by_vcpu, RowOrder::kKeyNumber);

  // Findings, each with the I/Os in flight at its time: replay the device events in time
  // order (the ring keeps the newest ones; older submits may be gone, which the loss
  // counters show).
  std::stable_sort(ios_.begin(), ios_.end(),
                   [](const Io& a, const Io& b) { return a.time_ns < b.time_ns; });
  std::stable_sort(s_.findings.begin(), s_.findings.end(),
                   [](const auto& a, const auto& b) { return a.time_ns < b.time_ns; });
  std::map<std::pair<std::string, uint64_t>, uint64_t> open;  // (device, io) -> submit time
  size_t next = 0;
  for (KeptFinding& f : s_.findings) {
    for (; next < ios_.size() && ios_[next].time_ns <= f.time_ns; ++next) {
      const Io& io = ios_[next];
      if (io.submit) {
        open[{io.device, io.io_id}] = io.time_ns;
      } else {
        open.erase({io.device, io.io_id});
      }
    }
    for (const auto& [key, t] : open)
      f.in_flight.push_back({key.first, key.second, t, f.time_ns - t});
  }
  return std::move(s_);
}

ExitSummary Summarize(const Dump& dump, const SummaryFilter& filter, EventSink* also) {
  ExitSummaryBuilder builder(filter);
  {
    sources::DumpSource source(dump);
    TeeSink both({&builder, also});
    source.Emit(also != nullptr ? static_cast<EventSink*>(&both) : &builder);
  }
  ExitSummary s = builder.Finish();

  // The dump's counters: no events, read as they are.
  std::map<std::string, uint64_t> counters;
  for (const DumpVcpu& v : dump.vcpus) {
    if (filter.vcpu && v.vcpu != *filter.vcpu) continue;
    // Counters come from the file: a sum saturates at 2^64-1 instead of wrapping.
    AddSat(s.losses.exits_written, v.counters.written);
    AddSat(s.losses.exits_overwritten, v.counters.overwritten);
    AddSat(s.losses.exits_skipped, v.counters.skipped);
    for (const auto& [name, value] : v.named_counters) AddSat(counters[name], value);
  }
  s.vcpu_counters.assign(counters.begin(), counters.end());
  const DeviceEventCounters& dc = dump.device_event_counters;
  s.losses.device_events_written = dc.written;
  s.losses.device_events_overwritten = dc.overwritten;
  s.losses.device_events_dropped = dc.dropped;
  s.losses.device_events_skipped = dc.skipped;
  s.losses.findings_dropped = dump.counters.findings_dropped;
  s.losses.bad_vcpu = dump.counters.bad_vcpu;
  s.losses.end_without_begin = dump.counters.end_without_begin;
  s.losses.begin_without_end = dump.counters.begin_without_end;
  s.losses.io_inflight_overflow = dump.counters.io_inflight_overflow;
  return s;
}

}  // namespace exitscope::analysis
