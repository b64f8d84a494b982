// cli/kernel_metrics.h: `--metrics ADDR:PORT` of `kvm live` and `kvm stat` (with or without
// --bpf), the kernel's view of the exits on the same metric names as a recorder's endpoint
// (docs/prometheus.md). One EventSink, one registry and one endpoint, whatever the source:
//
//   kvm live, kvm stat without BPF (tracefs): a tee in front of the aggregator
//     auto m = KernelMetrics::Start("127.0.0.1:9464", &agg, slow_ns, have_device_map);
//     src.Run(m.get());                        // OnExit: each paired exit, then to `agg`
//     m->SetLostEvents(src.lost_events());     // at each refresh
//
//   kvm stat --bpf: no event reaches userspace; each scrape reads the maps
//     auto m = KernelMetrics::StartBpf("127.0.0.1:9464", &bpf, row_options, have_device_map);
//     ... destroy `m` before `bpf` ...
//
// OnExit observes a single exit into exitscope_exit_duration_seconds{vm = VMM pid, vcpu,
// kind = exit reason, device, register} (device and register resolved by --device-map;
// "unassigned" for an MMIO / port access the map does not cover); exits without a time (kernel
// accesses, exits open at the end) are not observed, and slow ones (at least `slow_ns`, when
// not 0) count in exitscope_slow_exits_total. OnSamples observes an aggregate of one key (an
// eBPF map entry, ForEachBpfKvmExit) into the same series: a batch carries the source's running
// totals for its SampleBatch::source_key, and only what the key gained since the batch before
// is added. Its log-linear buckets are folded into the Prometheus buckets by their midpoint (a
// sample within 0.78 % of a bound may land in the neighbouring bucket); _sum and _count are
// exact. Device events and findings are handed on unchanged.
//
// Losses count in exitscope_lost_records_total{source, reason}: {"kernel_trace",
// "ring_overwritten"} for tracefs, {"kernel_bpf", "map_full"} for the maps, present (0) from
// the first scrape. With the maps, exits in flight set exitscope_vcpu_exit_in_progress_seconds.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "exitscope/status.h"
#include "sources/event.h"

namespace exitscope::sources::bpf {
class BpfKvmStat;
}
namespace exitscope::analysis {
struct BpfKvmRowOptions;
}

namespace exitscope::cli {

class KernelMetrics final : public EventSink {
 public:
  // The single exits of a tracefs stream. `listen` as ParseMetricsListen accepts; `next`
  // receives every event after it is observed.
  static Result<std::unique_ptr<KernelMetrics>> Start(const std::string& listen, EventSink* next,
                                                      uint64_t slow_ns, bool have_device_map);
  // The in-kernel maps of `kvm stat --bpf`, read at each scrape (BpfKvmStat::Read) and fed to
  // OnSamples, SetExitsInFlight and SetLostEvents. `bpf` must outlive the returned object.
  static Result<std::unique_ptr<KernelMetrics>> StartBpf(const std::string& listen,
                                                         const sources::bpf::BpfKvmStat* bpf,
                                                         const analysis::BpfKvmRowOptions& rows,
                                                         bool have_device_map);
  // Stops the listener: no scrape runs past this point.
  ~KernelMetrics() override;

  void OnExit(const ExitEvent& e) override;
  void OnSamples(const ExitEvent& e, const SampleBatch& b) override;
  void OnDeviceEvent(const DeviceEvent& e) override;
  void OnFinding(const Finding& f) override;
  // The source's lost total so far (tracefs: lost events; maps: samples and bucket counts).
  void SetLostEvents(uint64_t lost);
  // (vm, vcpu) -> seconds inside the current exit, for every vCPU in an exit now; a vCPU
  // listed before and not now is back in the guest (0).
  void SetExitsInFlight(const std::map<std::pair<uint32_t, uint32_t>, double>& inside);

  const std::string& address() const { return address_; }

 private:
  struct Options;
  struct State;
  static Result<std::unique_ptr<KernelMetrics>> Start(const std::string& listen, Options o);
  KernelMetrics() = default;
  std::shared_ptr<State> s_;
  std::string address_;
};

}  // namespace exitscope::cli
