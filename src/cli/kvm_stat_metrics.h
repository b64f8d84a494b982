// cli/kvm_stat_metrics.h: `exitscope kvm stat --bpf --metrics ADDR:PORT`, the in-kernel maps
// of `kvm stat --bpf` on the same metric names as `kvm live --metrics` (docs/prometheus.md).
//
//   auto m = KvmStatMetrics::Start("127.0.0.1:9464", &bpf, row_options, have_device_map);
//   ... every scrape reads the maps; destroy `m` before `bpf` ...
//
// No event reaches userspace, so nothing is observed per exit: each scrape reads the maps
// (BpfKvmStat::Read, a few map walks) and adds what each key gained since the previous scrape
// into exitscope_exit_duration_seconds{vm, vcpu, kind = exit reason, device, register}. A key's
// log-linear buckets are folded into the Prometheus buckets by their midpoint (a sample within
// 0.78 % of a bound may land in the neighbouring bucket); _sum and _count are exact. Exits in
// flight set exitscope_vcpu_exit_in_progress_seconds{vm, vcpu}; samples the maps could not keep
// count in exitscope_lost_records_total{source="kernel_bpf", reason="map_full"}.
#pragma once

#include <memory>
#include <string>

#include "analysis/bpf_kvm_rows.h"
#include "exitscope/status.h"
#include "sources/bpf/bpf_kvm_stat.h"

namespace exitscope::cli {

class KvmStatMetrics {
 public:
  // `listen` as ParseMetricsListen accepts. `bpf` must outlive the returned object.
  static Result<std::unique_ptr<KvmStatMetrics>> Start(const std::string& listen,
                                                       const sources::bpf::BpfKvmStat* bpf,
                                                       const analysis::BpfKvmRowOptions& rows,
                                                       bool have_device_map);
  // Stops the listener: no scrape reads the maps past this point.
  ~KvmStatMetrics();
  const std::string& address() const { return address_; }
  // The page a scrape gets now (reads the maps), for tests and the final state.
  std::string Render();

  struct State;

 private:
  KvmStatMetrics() = default;
  std::shared_ptr<State> s_;
  std::string address_;
};

}  // namespace exitscope::cli
