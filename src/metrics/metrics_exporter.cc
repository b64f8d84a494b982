// MetricsExporter: the collector thread that folds a Recorder's rings into ExitMetrics, and the
// prometheus-cpp (civetweb) listener that serves them. See exitscope/metrics.h.
#include "exitscope/metrics.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "exitscope/recorder.h"
#include "metrics/exit_metrics.h"
#include "prometheus/exposer.h"

namespace exitscope {
namespace {

// Snapshots (device events, findings, exits in progress) at most this often.
constexpr uint64_t kSnapshotPeriodNs = 1'000'000'000;
// The per-address label cache is cleared past this size (an MMIO scan touches millions).
constexpr size_t kMaxCachedAddresses = 1 << 16;

struct AddressKey {
  uint64_t addr;
  uint32_t vcpu;
  uint32_t generation;
  uint8_t kind, size, dir;
  bool operator==(const AddressKey&) const = default;
};
struct AddressKeyHash {
  size_t operator()(const AddressKey& k) const noexcept {
    uint64_t h = k.addr * 0x9e3779b97f4a7c15ull;
    h ^= (uint64_t{k.vcpu} << 32 | k.generation) + 0x7f4a7c15ull + (h << 6) + (h >> 2);
    h ^= (uint64_t{k.kind} << 16 | uint64_t{k.size} << 8 | k.dir) * 0xbf58476d1ce4e5b9ull;
    return static_cast<size_t>(h ^ (h >> 31));
  }
};

// What identifies one device event or finding across two snapshots.
struct Fingerprint {
  uint64_t time_ns, a, b;
  uint32_t c;
  uint8_t type;
  bool operator==(const Fingerprint&) const = default;
};
struct FingerprintHash {
  size_t operator()(const Fingerprint& f) const noexcept {
    uint64_t h = f.time_ns * 0x9e3779b97f4a7c15ull ^ f.a * 0xbf58476d1ce4e5b9ull ^
                 f.b * 0x94d049bb133111ebull ^ (uint64_t{f.c} << 8 | f.type);
    return static_cast<size_t>(h ^ (h >> 29));
  }
};
using FingerprintSet = std::unordered_set<Fingerprint, FingerprintHash>;

// Keeps, across snapshots of a ring that only ever appends and forgets its oldest entries, which
// entries are new, and how many went by unseen (a gap: nothing of the previous snapshot is left
// and the source says it forgot some).
class SnapshotDiff {
 public:
  // `total` is the number of entries the source ever kept, as of this snapshot.
  template <typename T, typename Fp, typename F>
  void Apply(const std::vector<T>& items, Fp fingerprint, uint64_t total, F on_new,
             uint64_t* missed) {
    FingerprintSet now;
    now.reserve(items.size());
    uint64_t fresh = 0;
    bool overlap = false;
    for (const T& it : items) {
      const Fingerprint f = fingerprint(it);
      now.insert(f);
      if (prev_.contains(f)) {
        overlap = true;
        continue;
      }
      if (!first_) {
        ++fresh;
        on_new(it);
      }
    }
    if (first_) {
      for (const T& it : items) on_new(it);  // what the source still holds when we start
    } else if (!overlap && !prev_.empty() && total > last_total_ + fresh) {
      *missed += total - last_total_ - fresh;
    }
    first_ = false;
    last_total_ = total;
    prev_ = std::move(now);
  }

 private:
  bool first_ = true;
  uint64_t last_total_ = 0;
  FingerprintSet prev_;
};

std::string DefaultVm() {
  return std::to_string(::getpid());
}

}  // namespace

Result<std::string> ParseMetricsListen(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return Fail(ErrorCode::kInvalidArgument,
                "metrics address '" + std::string(text) + "': " + std::string(why) +
                    " (expected ADDR:PORT or :PORT, e.g. 127.0.0.1:9464)");
  };
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return bad("no port");
  std::string host(text.substr(0, colon));
  const std::string_view port_text = text.substr(colon + 1);
  unsigned port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || end != port_text.data() + port_text.size() ||
      port > 65535) {
    return bad("port must be 0..65535");
  }
  if (host.empty() || host == "localhost") host = "127.0.0.1";
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) != 1) return bad("not an IPv4 address");
  return host + ":" + std::to_string(port);
}

std::vector<double> MetricsDurationBuckets() {
  return metrics::DurationBuckets();
}

struct MetricsExporter::Impl {
  Impl(const Recorder& r, const MetricsOptions& o)
      : rec(r), opts(o), vm(o.vm.empty() ? DefaultVm() : o.vm), m(o.max_registers_per_device) {}

  const Recorder& rec;
  MetricsOptions opts;
  std::string vm;
  std::unique_ptr<prometheus::Exposer> exposer;
  std::string address;
  uint16_t port = 0;

  std::mutex mu;  // one collector pass at a time; guards everything below
  metrics::ExitMetrics m;
  std::vector<uint64_t> next;  // per vCPU: the next record index to fold
  std::vector<ExitRecord> buf;
  std::unordered_map<AddressKey, metrics::ExitMetrics::ExitSeries*, AddressKeyHash> by_address;
  std::vector<metrics::ExitMetrics::ExitSeries*> by_kind;  // vcpu * kExitKindCount + kind
  uint64_t last_snapshot_ns = 0;
  SnapshotDiff events_diff, findings_diff;
  struct Pending {
    uint32_t device;
    uint64_t io_id;
    bool operator==(const Pending&) const = default;
  };
  struct PendingHash {
    size_t operator()(const Pending& p) const noexcept {
      return static_cast<size_t>((p.io_id * 0x9e3779b97f4a7c15ull) ^ p.device);
    }
  };
  std::unordered_map<Pending, uint64_t, PendingHash> pending;  // -> submit time (ns)
  MetricsCounters c;
  // Mirrors of the recorder's own monotonic counters.
  struct Last {
    uint64_t overwritten = 0, skipped = 0, bad_vcpu = 0, ev_dropped = 0, ev_overwritten = 0,
             ev_skipped = 0, findings_dropped = 0, exits_missed = 0, ev_missed = 0,
             findings_missed = 0, untracked = 0;
  } last;

  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stop = false;
  std::thread thread;

  metrics::ExitMetrics::ExitSeries& SeriesFor(const ExitRecord& r);
  void FoldExits();
  void FoldSnapshot(bool force);
  void MirrorCounters();
  void Pass(bool force_snapshot) {
    std::lock_guard<std::mutex> lock(mu);
    FoldExits();
    FoldSnapshot(force_snapshot);
    MirrorCounters();
    ++c.collections;
    c.series = m.series();
  }
  void Run() {
    std::unique_lock<std::mutex> lock(stop_mu);
    while (!stop) {
      stop_cv.wait_for(lock, std::chrono::milliseconds(opts.collect_interval_ms));
      if (stop) break;
      lock.unlock();
      Pass(false);
      lock.lock();
    }
  }
};

metrics::ExitMetrics::ExitSeries& MetricsExporter::Impl::SeriesFor(const ExitRecord& r) {
  const bool has_target = r.kind == ExitKind::kMmio || r.kind == ExitKind::kPio;
  const std::string_view kind = ToString(r.kind);
  if (!has_target) {
    const size_t i = size_t{r.vcpu} * kExitKindCount +
                     std::min<size_t>(static_cast<size_t>(r.kind), kExitKindCount - 1);
    if (i >= by_kind.size()) by_kind.resize(size_t{rec.num_vcpus()} * kExitKindCount);
    if (by_kind[i] == nullptr) by_kind[i] = &m.Exit(vm, r.vcpu, kind, "", "");
    return *by_kind[i];
  }
  const uint32_t generation = (r.flags & kExitFlagUnresolved) != 0 ? r.device : kUnassigned;
  const AddressKey key{r.addr,     r.vcpu,
                       generation, static_cast<uint8_t>(r.kind),
                       r.size,     static_cast<uint8_t>(r.dir)};
  if (auto it = by_address.find(key); it != by_address.end()) return *it->second;
  if (by_address.size() >= kMaxCachedAddresses) by_address.clear();
  // Resolve against the address-space generation of the access (a moved BAR keeps its name).
  const AddressSpace& space = rec.address_space();
  const Resolution res = space.LookupAt(generation, SpaceOf(r.kind), r.addr, r.size, r.dir);
  metrics::ExitMetrics::ExitSeries* s;
  if (!res.assigned()) {
    s = &m.Exit(vm, r.vcpu, kind, metrics::kUnassignedLabel, "");
  } else {
    s = &m.Exit(vm, r.vcpu, kind, space.DeviceName(res.device),
                AddressSpace::RegisterName(res, r.size));
  }
  by_address.emplace(key, s);
  return *s;
}

void MetricsExporter::Impl::FoldExits() {
  const uint32_t n = rec.num_vcpus();
  if (next.size() != n) next.assign(n, 0);
  const Clock& clock = rec.clock();
  for (uint32_t v = 0; v < n; ++v) {
    buf.clear();
    c.exits_missed += rec.flight_recorder().ring(v).ReadFrom(&next[v], &buf);
    for (const ExitRecord& r : buf) {
      metrics::ExitMetrics::ExitSeries& s = SeriesFor(r);
      s.duration->Observe(static_cast<double>(clock.TicksToNs(r.duration_ticks)) * 1e-9);
      if ((r.flags & kExitFlagSlow) != 0) s.slow->Increment();
    }
    c.exits_folded += buf.size();
  }
}

void MetricsExporter::Impl::FoldSnapshot(bool force) {
  const uint64_t now = Clock::MonotonicNs();
  if (!force && last_snapshot_ns != 0 && now - last_snapshot_ns < kSnapshotPeriodNs) return;
  last_snapshot_ns = now;
  const Dump d = rec.Snapshot({.include_guest_data = false, .max_exits_per_vcpu = 1});

  for (const DumpVcpu& v : d.vcpus) {
    m.InExit(vm, v.vcpu)
        .Set(v.in_progress ? static_cast<double>(v.in_progress->duration_ns) * 1e-9 : 0.0);
  }

  auto device_name = [&](uint32_t index) -> std::string {
    return index == kUnassigned ? std::string(metrics::kUnassignedLabel) : d.DeviceName(index);
  };
  const DeviceEventCounters& ec = d.device_event_counters;
  events_diff.Apply(
      d.device_events,
      [](const DumpDeviceEvent& e) {
        return Fingerprint{e.time_ns, e.io_id, static_cast<uint64_t>(e.status), e.device,
                           static_cast<uint8_t>(e.type)};
      },
      ec.written - std::min(ec.written, ec.dropped),
      [&](const DumpDeviceEvent& e) {
        ++c.device_events_folded;
        if (e.type == DeviceEventType::kIoSubmit) {
          if (pending.size() >= opts.max_tracked_ios) {
            ++c.ios_untracked;
            return;
          }
          pending[{e.device, e.io_id}] = e.time_ns;
        } else if (e.type == DeviceEventType::kIoComplete) {
          auto it = pending.find({e.device, e.io_id});
          if (it == pending.end()) {
            ++c.ios_untracked;
            return;
          }
          const uint64_t ns = e.time_ns > it->second ? e.time_ns - it->second : 0;
          m.Io(vm, device_name(e.device)).latency->Observe(static_cast<double>(ns) * 1e-9);
          pending.erase(it);
        }
      },
      &c.device_events_missed);

  // In flight, per device (every device with I/O seen so far, so an idle one reads 0).
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> per_device;  // -> (count, oldest submit)
  for (const auto& [p, t] : pending) {
    auto& [count, oldest] = per_device.try_emplace(p.device, 0, UINT64_MAX).first->second;
    ++count;
    oldest = std::min(oldest, t);
  }
  for (const DeviceInfo& dev : d.devices) per_device.try_emplace(dev.index, 0, UINT64_MAX);
  for (const auto& [dev, v] : per_device) {
    metrics::ExitMetrics::IoSeries& s = m.Io(vm, device_name(dev));
    s.in_flight->Set(static_cast<double>(v.first));
    s.oldest->Set(v.first == 0 || d.monotonic_ns < v.second
                      ? 0.0
                      : static_cast<double>(d.monotonic_ns - v.second) * 1e-9);
  }

  findings_diff.Apply(
      d.findings,
      [](const FindingRecord& f) {
        return Fingerprint{f.time_ns, f.duration_ns, f.io_id ^ f.addr, f.vcpu,
                           static_cast<uint8_t>(f.type)};
      },
      d.findings.size() + d.counters.findings_dropped,
      [&](const FindingRecord& f) {
        ++c.findings_folded;
        if (f.type == FindingType::kStuckExitBegin) m.Stuck(vm, f.vcpu).Increment();
        if (f.type == FindingType::kAgedIo) m.Io(vm, device_name(f.device)).aged->Increment();
      },
      &c.findings_missed);

  using M = metrics::ExitMetrics;
  M::Mirror(m.Lost(vm, "device_events", "dropped"), ec.dropped, &last.ev_dropped);
  M::Mirror(m.Lost(vm, "device_events", "ring_overwritten"), ec.overwritten, &last.ev_overwritten);
  M::Mirror(m.Lost(vm, "device_events", "snapshot_skipped"), ec.skipped, &last.ev_skipped);
  M::Mirror(m.Lost(vm, "findings", "dropped"), d.counters.findings_dropped, &last.findings_dropped);
}

void MetricsExporter::Impl::MirrorCounters() {
  using M = metrics::ExitMetrics;
  uint64_t overwritten = 0, skipped = 0;
  for (uint32_t v = 0; v < rec.num_vcpus(); ++v) {
    const RingCounters rc = rec.ring_counters(v);
    overwritten += rc.overwritten;
    skipped += rc.skipped;
  }
  M::Mirror(m.Lost(vm, "exits", "ring_overwritten"), overwritten, &last.overwritten);
  M::Mirror(m.Lost(vm, "exits", "snapshot_skipped"), skipped, &last.skipped);
  M::Mirror(m.Lost(vm, "exits", "bad_vcpu"), rec.counters().bad_vcpu, &last.bad_vcpu);
  M::Mirror(m.Lost(vm, "exits", "exporter_missed"), c.exits_missed, &last.exits_missed);
  M::Mirror(m.Lost(vm, "device_events", "exporter_missed"), c.device_events_missed,
            &last.ev_missed);
  M::Mirror(m.Lost(vm, "findings", "exporter_missed"), c.findings_missed, &last.findings_missed);
  M::Mirror(m.Lost(vm, "device_events", "io_unpaired"), c.ios_untracked, &last.untracked);
}

MetricsExporter::MetricsExporter() = default;

Result<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(const Recorder& recorder,
                                                                const MetricsOptions& options) {
  auto bad = [](std::string what) { return Fail(ErrorCode::kInvalidArgument, std::move(what)); };
  if (options.collect_interval_ms < 1 || options.collect_interval_ms > 60000)
    return bad("metrics collect_interval_ms " + std::to_string(options.collect_interval_ms) +
               ": out of range (1..60000)");
  if (options.max_registers_per_device < 1 || options.max_registers_per_device > 4096)
    return bad("metrics max_registers_per_device " +
               std::to_string(options.max_registers_per_device) + ": out of range (1..4096)");
  if (options.max_tracked_ios < 16 || options.max_tracked_ios > (1u << 24))
    return bad("metrics max_tracked_ios " + std::to_string(options.max_tracked_ios) +
               ": out of range (16..16777216)");
  std::string listen;
  if (options.serve) {
    auto l = ParseMetricsListen(options.listen);
    if (!l) return Propagate(l);
    listen = *l;
  }
  std::unique_ptr<MetricsExporter> e(new MetricsExporter());
  e->impl_ = std::make_unique<Impl>(recorder, options);
  Impl& s = *e->impl_;
  s.Pass(true);  // series of what the recorder holds already, before the first scrape
  if (options.serve) {
    auto served = metrics::Serve(listen, s.m.registry());
    if (!served) return Propagate(served);
    s.exposer = std::move(served->exposer);
    s.address = served->address;
    s.port = served->port;
  }
  s.thread = std::thread([&s] { s.Run(); });
  return e;
}

MetricsExporter::~MetricsExporter() {
  if (!impl_) return;
  impl_->exposer.reset();
  {
    std::lock_guard<std::mutex> lock(impl_->stop_mu);
    impl_->stop = true;
  }
  impl_->stop_cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::string MetricsExporter::address() const {
  return impl_->address;
}
uint16_t MetricsExporter::port() const noexcept {
  return impl_->port;
}
void MetricsExporter::Collect() {
  impl_->Pass(true);
}
std::string MetricsExporter::Render() const {
  return impl_->m.Render();
}

MetricsCounters MetricsExporter::counters() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->c;
}

}  // namespace exitscope
