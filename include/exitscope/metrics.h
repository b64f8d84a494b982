// exitscope/metrics.h: a Prometheus endpoint for a Recorder (pull mode, prometheus-cpp).
//
//   auto rec = exitscope::Recorder::Create({.num_vcpus = 4});
//   ...
//   auto metrics = exitscope::MetricsExporter::Start(**rec, {.listen = "127.0.0.1:9464"});
//   if (!metrics) { fprintf(stderr, "%s\n", metrics.error().message.c_str()); return 1; }
//   // curl http://127.0.0.1:9464/metrics
//   // ... at the end: metrics->reset() (stops the server and the collector thread) before the
//   // recorder goes away.
//
// A collector thread reads, every collect_interval_ms, the records each vCPU ring gained since
// the last pass (ExitRing::ReadFrom) and folds them into per-series histograms and counters;
// once a second (or at each interval if longer) it also reads device events, findings and
// counters from a Recorder::Snapshot limited to one exit per vCPU. The vCPU threads' hot path
// is not touched: nothing in BeginExit / EndExit knows the exporter exists. A record a ring
// overwrote before the collector read it is counted in
// exitscope_lost_records_total{source="exits",reason="exporter_missed"}, never dropped silently.
//
// Metric names, labels, buckets and the cardinality bound are in docs/prometheus.md. In short:
//   exitscope_exit_duration_seconds{vm,vcpu,kind,device,register}  histogram, 100 ns .. 100 s
//   exitscope_slow_exits_total{vm,vcpu,kind,device,register}       counter
//   exitscope_stuck_vcpu_total{vm,vcpu}, exitscope_vcpu_exit_in_progress_seconds{vm,vcpu}
//   exitscope_io_latency_seconds{vm,device} (submit -> complete),
//   exitscope_io_in_flight{vm,device}, exitscope_io_oldest_in_flight_seconds{vm,device},
//   exitscope_aged_io_total{vm,device} exitscope_lost_records_total{vm,source,reason}
// MMIO / PIO exits to no device have device="unassigned" and register=""; a device's register
// label takes at most max_registers_per_device distinct values, later ones are "other".
//
// Thread-safety: every method may be called from any thread. The Recorder must outlive the
// exporter.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "exitscope/export.h"
#include "exitscope/status.h"

namespace exitscope {

class Recorder;

struct MetricsOptions {
  // ADDR:PORT to listen on (IPv4). ":PORT" means 127.0.0.1:PORT; port 0 picks a free port
  // (see MetricsExporter::port()). 0.0.0.0 only when given explicitly.
  std::string listen = "127.0.0.1:9464";
  bool serve = true;  // false: no HTTP listener, only Render() (benchmarks, tests)
  // Value of the `vm` label; "" = this process's id (what `exitscope kvm live` uses too).
  std::string vm = "";
  uint32_t collect_interval_ms = 250;      // 1..60000
  uint32_t max_registers_per_device = 64;  // 1..4096; beyond: register="other"
  uint32_t max_tracked_ios = 65536;        // I/Os in flight the exporter pairs (16..2^24)
};

struct MetricsCounters {
  uint64_t collections = 0;           // collector passes so far
  uint64_t exits_folded = 0;          // exit records folded into histograms
  uint64_t exits_missed = 0;          // overwritten before the collector read them
  uint64_t device_events_folded = 0;  // device events read
  uint64_t device_events_missed = 0;  // device events gone before the collector read them
  uint64_t findings_folded = 0;       // findings read
  uint64_t findings_missed = 0;       // findings gone before the collector read them
  uint64_t ios_untracked = 0;         // submits not paired (table full) or completions alone
  uint64_t series = 0;                // time series exposed (each bucket counts one)
};

class EXITSCOPE_EXPORT MetricsExporter {
 public:
  // Validates options (kInvalidArgument naming the option), binds the listener (kIo when the
  // address cannot be bound, e.g. in use) and starts the collector thread.
  static Result<std::unique_ptr<MetricsExporter>> Start(const Recorder& recorder,
                                                        const MetricsOptions& options = {});
  // Stops the listener, then the collector thread. Takes up to ~2 s: civetweb's listener wakes
  // from its poll only that often.
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // The address actually bound, "127.0.0.1:40123" ("" when !serve), and its port.
  std::string address() const;
  uint16_t port() const noexcept;
  // Runs one collector pass now (the thread keeps its own schedule).
  void Collect();
  // The Prometheus text exposition format, as served on /metrics.
  std::string Render() const;
  MetricsCounters counters() const;

 private:
  MetricsExporter();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Parses a listen address: "ADDR:PORT" with ADDR an IPv4 address or "localhost", or ":PORT"
// (loopback). Returns the normalised "ADDR:PORT"; kInvalidArgument with a message naming the
// value otherwise.
EXITSCOPE_EXPORT Result<std::string> ParseMetricsListen(std::string_view text);

// Upper bounds (seconds) of the buckets of every *_seconds histogram: 100 ns to 100 s, 1, 2.5
// and 5 per decade (28 bounds, then +Inf).
EXITSCOPE_EXPORT std::vector<double> MetricsDurationBuckets();

}  // namespace exitscope
