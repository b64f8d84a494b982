#include "cli/kvm_live_metrics.h"

#include <mutex>

#include "exitscope/metrics.h"
#include "metrics/exit_metrics.h"
#include "prometheus/exposer.h"

namespace exitscope::cli {

struct KvmLiveMetrics::State {
  explicit State(uint64_t slow) : m(64), slow_ns(slow) {}
  metrics::ExitMetrics m;
  uint64_t slow_ns;
  bool have_map = false;
  uint64_t lost_last = 0;
  std::unique_ptr<prometheus::Exposer> exposer;
};

Result<std::unique_ptr<KvmLiveMetrics>> KvmLiveMetrics::Start(const std::string& listen,
                                                              EventSink* next, uint64_t slow_ns,
                                                              bool have_device_map) {
  auto addr = ParseMetricsListen(listen);
  if (!addr) return Propagate(addr);
  std::unique_ptr<KvmLiveMetrics> k(new KvmLiveMetrics());
  k->next_ = next;
  k->s_ = std::make_unique<State>(slow_ns);
  k->s_->have_map = have_device_map;
  k->s_->m.Lost("", "kernel_trace", "ring_overwritten");  // present (0) from the first scrape
  auto served = metrics::Serve(*addr, k->s_->m.registry());
  if (!served) return Propagate(served);
  k->s_->exposer = std::move(served->exposer);
  k->address_ = served->address;
  return k;
}

KvmLiveMetrics::~KvmLiveMetrics() {
  if (s_) s_->exposer.reset();  // no scrape runs past this point
}

void KvmLiveMetrics::OnExit(const ExitEvent& e) {
  if (e.end == ExitEnd::kSeen && !e.kernel_access) {
    std::string_view device = e.device, reg = e.reg;
    const bool addressed = e.subkey_kind == SubKeyKind::kMmio || e.subkey_kind == SubKeyKind::kPort;
    if (device.empty() && addressed && s_->have_map) {
      device = metrics::kUnassignedLabel;
      reg = {};
    }
    metrics::ExitMetrics::ExitSeries& series =
        s_->m.Exit(std::to_string(e.vm), e.vcpu, e.reason, device, reg);
    series.duration->Observe(static_cast<double>(e.duration_ns) * 1e-9);
    if (s_->slow_ns != 0 && e.duration_ns >= s_->slow_ns) series.slow->Increment();
  }
  next_->OnExit(e);
}

void KvmLiveMetrics::SetLostEvents(uint64_t lost) {
  metrics::ExitMetrics::Mirror(s_->m.Lost("", "kernel_trace", "ring_overwritten"), lost,
                               &s_->lost_last);
}

}  // namespace exitscope::cli
