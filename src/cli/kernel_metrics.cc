#include "cli/kernel_metrics.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "analysis/bpf_kvm_rows.h"
#include "base/histogram.h"
#include "exitscope/metrics.h"
#include "metrics/exit_metrics.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "sources/bpf/bpf_kvm_stat.h"

namespace exitscope::cli {

struct KernelMetrics::Options {
  EventSink* next = nullptr;  // may be null: nothing behind the metrics
  uint64_t slow_ns = 0;
  bool have_device_map = false;
  std::string_view lost_source, lost_reason;  // exitscope_lost_records_total{source, reason}
  // Runs at each scrape before the registry is collected, one scrape at a time: a source
  // whose state is read rather than streamed (the maps) feeds the sink here.
  std::function<void(KernelMetrics&)> on_scrape;
};

struct KernelMetrics::State final : prometheus::Collectable {
  State() : m(64) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::lock_guard scrape(scrape_mu);
    if (o.on_scrape) o.on_scrape(*owner);
    return m.registry()->Collect();
  }
  // The series of `e`, with an address no device answered collapsed into "unassigned".
  metrics::ExitMetrics::ExitSeries& Series(const ExitEvent& e) {
    std::string_view device = e.device, reg = e.reg;
    const bool addressed = e.subkey_kind == SubKeyKind::kMmio || e.subkey_kind == SubKeyKind::kPort;
    if (device.empty() && addressed && o.have_device_map) {
      device = metrics::kUnassignedLabel;
      reg = {};
    }
    return m.Exit(std::to_string(e.vm), e.vcpu, e.reason, device, reg);
  }

  Options o;
  KernelMetrics* owner = nullptr;
  mutable std::mutex scrape_mu;  // one on_scrape at a time
  std::mutex mu;                 // the writers of `m` and what follows
  metrics::ExitMetrics m;
  uint64_t lost_last = 0;
  // OnSamples, per source_key: the Prometheus bucket counts and the sum folded in so far.
  struct Folded {
    std::vector<uint64_t> buckets;
    uint64_t sum = 0;
  };
  std::unordered_map<std::string, Folded> folded;
  std::vector<double> bounds_ns;                          // the Prometheus bucket bounds, in ns
  std::set<std::pair<uint32_t, uint32_t>> in_exit_shown;  // (vm, vcpu) with a gauge
  std::unique_ptr<prometheus::Exposer> exposer;
};

Result<std::unique_ptr<KernelMetrics>> KernelMetrics::Start(const std::string& listen, Options o) {
  auto addr = ParseMetricsListen(listen);
  if (!addr) return Propagate(addr);
  std::unique_ptr<KernelMetrics> k(new KernelMetrics());
  auto s = std::make_shared<State>();
  s->o = std::move(o);
  s->owner = k.get();
  for (double b : metrics::DurationBuckets()) s->bounds_ns.push_back(b * 1e9);
  s->m.Lost("", s->o.lost_source, s->o.lost_reason);  // present (0) from the first scrape
  k->s_ = s;
  auto served = metrics::Serve(*addr, s);
  if (!served) return Propagate(served);
  s->exposer = std::move(served->exposer);
  k->address_ = served->address;
  return k;
}

Result<std::unique_ptr<KernelMetrics>> KernelMetrics::Start(const std::string& listen,
                                                            EventSink* next, uint64_t slow_ns,
                                                            bool have_device_map) {
  return Start(listen, Options{.next = next,
                               .slow_ns = slow_ns,
                               .have_device_map = have_device_map,
                               .lost_source = "kernel_trace",
                               .lost_reason = "ring_overwritten",
                               .on_scrape = nullptr});
}

Result<std::unique_ptr<KernelMetrics>> KernelMetrics::StartBpf(
    const std::string& listen, const sources::bpf::BpfKvmStat* bpf,
    const analysis::BpfKvmRowOptions& rows, bool have_device_map) {
  analysis::BpfKvmRowOptions r = rows;
  r.final = false;  // the maps still change: exits in flight are in flight now
  auto scrape = [bpf, r](KernelMetrics& k) {
    auto snap = bpf->Read();
    if (!snap) return;  // the page shows the previous read
    analysis::ForEachBpfKvmExit(*snap, r,
                                [&](const ExitEvent& e, const sources::bpf::BpfKvmSample& s) {
                                  k.OnSamples(e, s.batch());
                                });
    // Exits in flight, their threads numbered as the rows number them.
    std::map<std::pair<uint32_t, uint32_t>, double> inside;
    const analysis::BpfKvmRows rows_now = analysis::BuildBpfKvmRows(*snap, r);
    for (const auto& f : rows_now.in_flight) {
      inside[{f.exit.vm, f.exit.vcpu}] = static_cast<double>(f.inside_ns) * 1e-9;
    }
    k.SetExitsInFlight(inside);
    k.SetLostEvents(snap->counters.keys_full + snap->counters.buckets_full);
  };
  return Start(listen, Options{.next = nullptr,
                               .slow_ns = 0,
                               .have_device_map = have_device_map,
                               .lost_source = "kernel_bpf",
                               .lost_reason = "map_full",
                               .on_scrape = std::move(scrape)});
}

KernelMetrics::~KernelMetrics() {
  if (s_) s_->exposer.reset();  // no scrape runs past this point
}

void KernelMetrics::OnExit(const ExitEvent& e) {
  if (e.end == ExitEnd::kSeen && !e.kernel_access) {
    std::lock_guard lock(s_->mu);
    metrics::ExitMetrics::ExitSeries& series = s_->Series(e);
    series.duration->Observe(static_cast<double>(e.duration_ns) * 1e-9);
    if (s_->o.slow_ns != 0 && e.duration_ns >= s_->o.slow_ns) series.slow->Increment();
  }
  if (s_->o.next != nullptr) s_->o.next->OnExit(e);
}

void KernelMetrics::OnSamples(const ExitEvent& e, const SampleBatch& b) {
  if (!e.kernel_access && b.timed != 0) {
    using base::LatencyHistogram;
    const std::vector<double>& bounds = s_->bounds_ns;
    const size_t nb = bounds.size() + 1;  // + Inf
    std::vector<uint64_t> now(nb);
    for (const auto& [bucket, count] : b.buckets) {
      if (bucket >= LatencyHistogram::kBuckets) continue;
      const double mid = (static_cast<double>(LatencyHistogram::BucketLow(bucket)) +
                          static_cast<double>(LatencyHistogram::BucketHigh(bucket))) /
                         2.0;
      now[std::lower_bound(bounds.begin(), bounds.end(), mid) - bounds.begin()] += count;
    }
    std::lock_guard lock(s_->mu);
    State::Folded none;  // a batch without a source_key is all new
    State::Folded& f = b.source_key.empty() ? none : s_->folded[std::string(b.source_key)];
    if (f.buckets.empty()) f.buckets.assign(nb, 0);
    std::vector<double> inc(nb);
    bool grew = false;
    for (size_t i = 0; i < nb; ++i) {
      inc[i] = now[i] > f.buckets[i] ? static_cast<double>(now[i] - f.buckets[i]) : 0.0;
      grew |= inc[i] != 0.0;
      f.buckets[i] = std::max(f.buckets[i], now[i]);
    }
    if (grew) {
      const uint64_t dsum = b.sum > f.sum ? b.sum - f.sum : 0;
      f.sum = std::max(f.sum, b.sum);
      s_->Series(e).duration->ObserveMultiple(inc, static_cast<double>(dsum) * 1e-9);
    }
  }
  if (s_->o.next != nullptr) s_->o.next->OnSamples(e, b);
}

void KernelMetrics::OnDeviceEvent(const DeviceEvent& e) {
  if (s_->o.next != nullptr) s_->o.next->OnDeviceEvent(e);
}

void KernelMetrics::OnFinding(const Finding& f) {
  if (s_->o.next != nullptr) s_->o.next->OnFinding(f);
}

void KernelMetrics::SetLostEvents(uint64_t lost) {
  std::lock_guard lock(s_->mu);
  metrics::ExitMetrics::Mirror(s_->m.Lost("", s_->o.lost_source, s_->o.lost_reason), lost,
                               &s_->lost_last);
}

void KernelMetrics::SetExitsInFlight(
    const std::map<std::pair<uint32_t, uint32_t>, double>& inside) {
  std::lock_guard lock(s_->mu);
  std::map<std::pair<uint32_t, uint32_t>, double> all = inside;
  for (const auto& k : s_->in_exit_shown) all.try_emplace(k, 0.0);  // back in the guest
  for (const auto& [k, seconds] : all) {
    s_->m.InExit(std::to_string(k.first), k.second).Set(seconds);
    s_->in_exit_shown.insert(k);
  }
}

}  // namespace exitscope::cli
