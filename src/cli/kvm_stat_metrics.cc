#include "cli/kvm_stat_metrics.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/histogram.h"
#include "exitscope/metrics.h"
#include "metrics/exit_metrics.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace exitscope::cli {

struct KvmStatMetrics::State final : prometheus::Collectable {
  State() : m(64) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::lock_guard lock(mu);
    Fold();
    return m.registry()->Collect();
  }
  void Fold() const;

  mutable std::mutex mu;
  mutable metrics::ExitMetrics m;
  const sources::bpf::BpfKvmStat* bpf = nullptr;
  analysis::BpfKvmRowOptions rows;
  bool have_map = false;
  // Per map key (its bytes): the Prometheus bucket counts and the sum folded in so far.
  struct Folded {
    std::vector<uint64_t> buckets;
    uint64_t sum = 0;
  };
  mutable std::unordered_map<std::string, Folded> folded;
  mutable std::set<uint64_t> in_exit_shown;  // (vm << 32 | vcpu) with a gauge
  mutable uint64_t lost_last = 0;
  std::vector<double> bounds_ns;  // the Prometheus bucket bounds, in ns
  std::unique_ptr<prometheus::Exposer> exposer;
};

void KvmStatMetrics::State::Fold() const {
  auto snap = bpf->Read();
  if (!snap) return;  // the page shows the previous read
  using base::LatencyHistogram;
  const size_t nb = bounds_ns.size() + 1;  // + Inf
  std::vector<uint64_t> now(nb);
  std::vector<double> inc(nb);
  analysis::ForEachBpfKvmExit(
      *snap, rows, [&](const ExitEvent& e, const sources::bpf::BpfKvmSample& s) {
        if (e.kernel_access || s.stats.timed == 0) return;
        std::fill(now.begin(), now.end(), 0);
        for (const auto& [b, c] : s.buckets) {
          if (b >= LatencyHistogram::kBuckets) continue;
          const double mid = (static_cast<double>(LatencyHistogram::BucketLow(b)) +
                              static_cast<double>(LatencyHistogram::BucketHigh(b))) /
                             2.0;
          const size_t i =
              std::lower_bound(bounds_ns.begin(), bounds_ns.end(), mid) - bounds_ns.begin();
          now[i] += c;
        }
        Folded& f = folded[std::string(reinterpret_cast<const char*>(&s.key), sizeof s.key)];
        if (f.buckets.empty()) f.buckets.assign(nb, 0);
        bool grew = false;
        for (size_t i = 0; i < nb; ++i) {
          inc[i] = now[i] > f.buckets[i] ? static_cast<double>(now[i] - f.buckets[i]) : 0.0;
          grew |= inc[i] != 0.0;
          f.buckets[i] = std::max(f.buckets[i], now[i]);
        }
        if (!grew) return;
        const uint64_t dsum = s.stats.sum > f.sum ? s.stats.sum - f.sum : 0;
        f.sum = std::max<uint64_t>(f.sum, s.stats.sum);
        std::string_view device = e.device, reg = e.reg;
        const bool addressed =
            e.subkey_kind == SubKeyKind::kMmio || e.subkey_kind == SubKeyKind::kPort;
        if (device.empty() && addressed && have_map) {
          device = metrics::kUnassignedLabel;
          reg = {};
        }
        m.Exit(std::to_string(e.vm), e.vcpu, e.reason, device, reg)
            .duration->ObserveMultiple(inc, static_cast<double>(dsum) * 1e-9);
      });
  // Exits in flight: how long each vCPU thread has been inside its current exit (0 when in
  // the guest). Threads are numbered as the rows number them.
  const analysis::BpfKvmRows r = analysis::BuildBpfKvmRows(*snap, rows);
  std::map<uint64_t, double> inside;  // (vm << 32 | vcpu) -> seconds
  for (const auto& f : r.in_flight) {
    inside[(uint64_t{f.exit.vm} << 32) | f.exit.vcpu] = static_cast<double>(f.inside_ns) * 1e-9;
  }
  for (uint64_t k : in_exit_shown) inside.try_emplace(k, 0.0);  // back in the guest
  for (const auto& [k, v] : inside) {
    m.InExit(std::to_string(k >> 32), static_cast<uint32_t>(k)).Set(v);
    in_exit_shown.insert(k);
  }
  metrics::ExitMetrics::Mirror(m.Lost("", "kernel_bpf", "map_full"),
                               snap->counters.keys_full + snap->counters.buckets_full, &lost_last);
}

Result<std::unique_ptr<KvmStatMetrics>> KvmStatMetrics::Start(
    const std::string& listen, const sources::bpf::BpfKvmStat* bpf,
    const analysis::BpfKvmRowOptions& rows, bool have_device_map) {
  auto addr = ParseMetricsListen(listen);
  if (!addr) return Propagate(addr);
  std::unique_ptr<KvmStatMetrics> k(new KvmStatMetrics());
  auto s = std::make_shared<State>();
  s->bpf = bpf;
  s->rows = rows;
  s->rows.final = false;
  s->have_map = have_device_map;
  for (double b : metrics::DurationBuckets()) s->bounds_ns.push_back(b * 1e9);
  s->m.Lost("", "kernel_bpf", "map_full");  // present (0) from the first scrape
  k->s_ = s;
  auto served = metrics::Serve(*addr, s);
  if (!served) return Propagate(served);
  s->exposer = std::move(served->exposer);
  k->address_ = served->address;
  return k;
}

KvmStatMetrics::~KvmStatMetrics() {
  if (s_) s_->exposer.reset();  // no scrape runs past this point
}

std::string KvmStatMetrics::Render() {
  std::lock_guard lock(s_->mu);
  s_->Fold();
  return s_->m.Render();
}

}  // namespace exitscope::cli
