#include "analysis/exit_summary.h"

#include <algorithm>
#include <cinttypes>
#include <compare>
#include <cstdio>
#include <map>
#include <memory>

namespace exitscope::analysis {
namespace {

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%#" PRIx64, v);
  return buf;
}

// Groups keyed by string; LatencyStats is large (~30 KiB), so groups live on the heap once
// per key and exits only touch a map lookup.
class Grouper {
 public:
  LatencyStats& operator[](const std::string& key) {
    auto it = groups_.find(key);
    if (it == groups_.end()) it = groups_.emplace(key, std::make_unique<LatencyStats>()).first;
    return *it->second;
  }
  std::vector<ExitGroup> Sorted() const {
    std::vector<ExitGroup> out;
    out.reserve(groups_.size());
    for (const auto& [k, s] : groups_) out.push_back({k, *s});
    std::sort(out.begin(), out.end(), [](const ExitGroup& a, const ExitGroup& b) {
      if (a.stats.sum() != b.stats.sum()) return a.stats.sum() > b.stats.sum();
      return a.key < b.key;
    });
    return out;
  }

 private:
  std::map<std::string, std::unique_ptr<LatencyStats>> groups_;
};

// One distinct access, compared field by field.
struct AccessKey {
  uint32_t device;
  uint64_t addr;
  uint8_t size;
  AccessDir dir;
  ExitKind kind;
  auto operator<=>(const AccessKey&) const = default;
};

void AddSat(uint64_t& sum, uint64_t v) {
  if (__builtin_add_overflow(sum, v, &sum)) sum = UINT64_MAX;
}

bool HasTarget(const DumpExit& e) {
  return e.kind == ExitKind::kMmio || e.kind == ExitKind::kPio;
}

}  // namespace

std::string ExitTarget(const Dump& dump, const DumpExit& e) {
  if (!HasTarget(e)) return std::string(ToString(e.kind));
  if (e.device == kUnassigned) return "unassigned " + Hex(e.addr);
  std::string s = dump.DeviceName(e.device);
  const std::string reg = dump.RegisterName(e);
  if (!reg.empty()) return s + "." + reg;
  // No register there: offset within the device's range.
  for (const DumpRange& r : dump.ranges) {
    if (r.space == SpaceOf(e.kind) && e.addr >= r.base && e.addr - r.base < r.size)
      return s + "+" + Hex(e.addr - r.base);
  }
  return s + " " + Hex(e.addr);
}

ExitSummary Summarize(const Dump& dump, const SummaryFilter& filter) {
  ExitSummary s;
  Grouper kinds, devices, registers, vcpus;
  std::optional<uint32_t> want_device;
  bool want_unassigned = false;
  if (filter.device) {
    if (*filter.device == "unassigned") {
      want_unassigned = true;
    } else {
      want_device = kUnassigned - 1;  // matches nothing unless the name exists
      for (const DeviceInfo& d : dump.devices)
        if (d.name == *filter.device) want_device = d.index;
    }
  }
  auto passes_device = [&](uint32_t device) {
    if (want_unassigned) return device == kUnassigned;
    return !want_device || device == *want_device;
  };
  auto passes = [&](const DumpExit& e) {
    if (filter.vcpu && e.vcpu != *filter.vcpu) return false;
    return passes_device(e.device);
  };
  // Register keys are cached per access (device, addr, size, dir, kind), keyed by value: exits
  // repeat the same few accesses, and no two different accesses may share a key.
  std::map<AccessKey, std::string> reg_keys;
  std::map<std::string, uint64_t> counters;

  bool first = true;
  for (const DumpVcpu& v : dump.vcpus) {
    if (filter.vcpu && v.vcpu != *filter.vcpu) continue;
    // Counters come from the file: a sum saturates at 2^64-1 instead of wrapping.
    AddSat(s.losses.exits_written, v.counters.written);
    AddSat(s.losses.exits_overwritten, v.counters.overwritten);
    AddSat(s.losses.exits_skipped, v.counters.skipped);
    for (const auto& [name, value] : v.named_counters) AddSat(counters[name], value);
    for (const DumpExit& e : v.exits) {
      if (!passes(e)) continue;
      ++s.exits;
      AddSat(s.total_ns, e.duration_ns);
      if (first || e.start_ns < s.first_ns) s.first_ns = e.start_ns;
      uint64_t end = e.start_ns;
      AddSat(end, e.duration_ns);
      s.last_ns = std::max(s.last_ns, end);
      first = false;
      s.all.Add(e.duration_ns);
      kinds[std::string(ToString(e.kind))].Add(e.duration_ns);
      vcpus[std::to_string(e.vcpu)].Add(e.duration_ns);
      if (HasTarget(e)) {
        devices[e.device == kUnassigned ? "unassigned" : dump.DeviceName(e.device)].Add(
            e.duration_ns);
        const AccessKey ck{e.device, e.addr, e.size, e.dir, e.kind};
        auto it = reg_keys.find(ck);
        if (it == reg_keys.end()) {
          it = reg_keys.emplace(ck, ExitTarget(dump, e) + " " + std::string(ToString(e.dir))).first;
        }
        registers[it->second].Add(e.duration_ns);
      }
      if ((e.flags & (kExitFlagSlow | kExitFlagStalled)) != 0)
        s.slow.push_back({e, dump.DescribeExit(e), false});
    }
    if (v.in_progress && passes(*v.in_progress))
      s.slow.push_back({*v.in_progress, dump.DescribeExit(*v.in_progress), true});
  }
  std::stable_sort(s.slow.begin(), s.slow.end(), [](const NotableExit& a, const NotableExit& b) {
    return a.exit.start_ns < b.exit.start_ns;
  });
  s.by_kind = kinds.Sorted();
  s.by_device = devices.Sorted();
  s.by_register = registers.Sorted();
  s.by_vcpu = vcpus.Sorted();
  std::sort(s.by_vcpu.begin(), s.by_vcpu.end(), [](const ExitGroup& a, const ExitGroup& b) {
    return std::stoul(a.key) < std::stoul(b.key);
  });
  s.vcpu_counters.assign(counters.begin(), counters.end());

  // Findings, each with the I/Os in flight at its time: replay the device events in time
  // order (the ring keeps the newest ones; older submits may be gone, which the loss
  // counters show).
  std::vector<const DumpDeviceEvent*> ios;
  for (const DumpDeviceEvent& ev : dump.device_events)
    if (ev.type == DeviceEventType::kIoSubmit || ev.type == DeviceEventType::kIoComplete)
      ios.push_back(&ev);
  std::stable_sort(ios.begin(), ios.end(),
                   [](auto* a, auto* b) { return a->time_ns < b->time_ns; });
  std::vector<FindingRecord> findings = dump.findings;
  std::stable_sort(findings.begin(), findings.end(),
                   [](const auto& a, const auto& b) { return a.time_ns < b.time_ns; });
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> open;  // (device, io) -> submit time
  size_t next = 0;
  for (const FindingRecord& f : findings) {
    const bool exit_finding = f.type != FindingType::kAgedIo;
    if (exit_finding && filter.vcpu && f.vcpu != *filter.vcpu) continue;
    if (!passes_device(f.device)) continue;
    for (; next < ios.size() && ios[next]->time_ns <= f.time_ns; ++next) {
      const DumpDeviceEvent& ev = *ios[next];
      if (ev.type == DeviceEventType::kIoSubmit) {
        open[{ev.device, ev.io_id}] = ev.time_ns;
      } else {
        open.erase({ev.device, ev.io_id});
      }
    }
    FindingWithContext fc;
    fc.finding = f;
    fc.device_name = dump.DeviceName(f.device);
    for (const auto& [key, t] : open) {
      fc.in_flight.push_back({key.first, dump.DeviceName(key.first), key.second, t, f.time_ns - t});
    }
    s.findings.push_back(std::move(fc));
  }

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
