// metrics/exit_metrics.h: the exitscope metric families on one prometheus::Registry, with the
// label bounds applied. Shared by the Recorder's exporter (metrics_exporter.cc) and
// `exitscope kvm live` / `kvm stat --metrics` (cli/kernel_metrics.cc), so both expose the same
// names.
//
// Not thread-safe by itself: one writer (the collector) at a time; the registry's own locks
// make a concurrent scrape (Collect / Render) safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "exitscope/status.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace exitscope::metrics {

// The value of the device label for MMIO / PIO exits no device answered.
inline constexpr std::string_view kUnassignedLabel = "unassigned";
// The register label once a device has max_registers_per_device distinct ones.
inline constexpr std::string_view kOtherRegisterLabel = "other";

// 100 ns .. 100 s, 1 / 2.5 / 5 per decade, in seconds.
const std::vector<double>& DurationBuckets();

class ExitMetrics {
 public:
  explicit ExitMetrics(uint32_t max_registers_per_device);

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // The series of one (vm, vcpu, kind, device, register); `reg` is bounded per (vm, device).
  struct ExitSeries {
    prometheus::Histogram* duration = nullptr;
    prometheus::Counter* slow = nullptr;
  };
  ExitSeries& Exit(std::string_view vm, uint32_t vcpu, std::string_view kind,
                   std::string_view device, std::string_view reg);
  prometheus::Counter& Stuck(std::string_view vm, uint32_t vcpu);
  prometheus::Gauge& InExit(std::string_view vm, uint32_t vcpu);
  struct IoSeries {
    prometheus::Histogram* latency = nullptr;
    prometheus::Gauge* in_flight = nullptr;
    prometheus::Gauge* oldest = nullptr;
    prometheus::Counter* aged = nullptr;
  };
  IoSeries& Io(std::string_view vm, std::string_view device);
  // exitscope_lost_records_total{vm, source, reason}
  prometheus::Counter& Lost(std::string_view vm, std::string_view source, std::string_view reason);
  // Adds the increase of a monotonic source counter to `c` (`last` keeps the previous value).
  static void Mirror(prometheus::Counter& c, uint64_t value, uint64_t* last);

  // The text exposition format of everything in the registry.
  std::string Render() const;
  // Time series exposed: buckets + _sum + _count per histogram, one per counter or gauge.
  uint64_t series() const noexcept { return series_; }
  uint32_t max_registers_per_device() const noexcept { return max_regs_; }

 private:
  std::string_view BoundRegister(std::string_view vm, std::string_view device,
                                 std::string_view reg);

  uint32_t max_regs_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>* exit_duration_;
  prometheus::Family<prometheus::Counter>* slow_;
  prometheus::Family<prometheus::Counter>* stuck_;
  prometheus::Family<prometheus::Gauge>* in_exit_;
  prometheus::Family<prometheus::Histogram>* io_latency_;
  prometheus::Family<prometheus::Gauge>* io_in_flight_;
  prometheus::Family<prometheus::Gauge>* io_oldest_;
  prometheus::Family<prometheus::Counter>* aged_io_;
  prometheus::Family<prometheus::Counter>* lost_;
  // Caches keyed by the labels joined with '\x1f'.
  std::unordered_map<std::string, ExitSeries> exits_;
  std::unordered_map<std::string, prometheus::Counter*> stuck_series_;
  std::unordered_map<std::string, prometheus::Gauge*> in_exit_series_;
  std::unordered_map<std::string, IoSeries> io_series_;
  std::unordered_map<std::string, prometheus::Counter*> lost_series_;
  // (vm, device) -> register label values taken so far.
  std::map<std::string, std::map<std::string, std::string, std::less<>>, std::less<>> regs_;
  std::string key_;  // scratch
  uint64_t series_ = 0;
};

// An HTTP endpoint serving metrics (pull mode). Destroying `exposer` stops the serving; no
// scrape runs past that.
struct Served {
  std::unique_ptr<prometheus::Exposer> exposer;
  std::string address;  // the address it listens on, the port filled in
  uint16_t port = 0;
};

// The HTTP server's limits (civetweb: one worker thread per connection, docs/prometheus.md
// "Slow and idle clients"). kHttpThreads connections are served at once, the others wait in
// a queue; a connection that has not sent its whole request kRequestTimeoutMs after a worker
// took it is closed, so an idle or slow client holds a worker for at most that long.
inline constexpr int kHttpThreads = 256;
inline constexpr int kRequestTimeoutMs = 1000;

// Serves `what` on LISTEN, an address ParseMetricsListen accepted ("127.0.0.1:9464"; port 0
// takes a free one), with the limits above. Errors (kIo): the port is taken, the address is
// not local.
Result<Served> Serve(const std::string& listen, const std::weak_ptr<prometheus::Collectable>& what);

}  // namespace exitscope::metrics
