// cli/kvm_live_metrics.h: `exitscope kvm live --metrics ADDR:PORT`, the kernel's view of the
// exits on the same metric names as a recorder's endpoint (docs/prometheus.md).
//
// A tee in front of the live analysis: every exit the pairer produces is observed into
// exitscope_exit_duration_seconds{vm = VMM pid, vcpu, kind = exit reason, device, register}
// (device and register resolved by --device-map; "unassigned" for an MMIO / port access the
// map does not cover) and then handed on unchanged to the aggregator behind it. Exits without
// a time (kernel accesses, exits open at the end) are not observed. Slow exits (at least
// --duration USEC, when given) count in exitscope_slow_exits_total; tracefs losses in
// exitscope_lost_records_total{source="kernel_trace", reason="ring_overwritten"}.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "exitscope/status.h"
#include "sources/event.h"

namespace exitscope::cli {

class KvmLiveMetrics final : public EventSink {
 public:
  // `listen` as ParseMetricsListen accepts; `next` receives every event after it is observed.
  static Result<std::unique_ptr<KvmLiveMetrics>> Start(const std::string& listen, EventSink* next,
                                                       uint64_t slow_ns, bool have_device_map);
  ~KvmLiveMetrics() override;

  void OnExit(const ExitEvent& e) override;
  void OnDeviceEvent(const DeviceEvent& e) override { next_->OnDeviceEvent(e); }
  void OnFinding(const Finding& f) override { next_->OnFinding(f); }
  // The tracefs reader's lost-event total so far.
  void SetLostEvents(uint64_t lost);
  const std::string& address() const { return address_; }

 private:
  KvmLiveMetrics() = default;
  struct State;
  std::unique_ptr<State> s_;
  EventSink* next_ = nullptr;
  std::string address_;
};

}  // namespace exitscope::cli
