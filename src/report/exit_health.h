// report/exit_health.h: the exit-health report over a recorder Dump (file or live snapshot):
// `exitscope inspect` prints it, and `exitscope run` prints it when the guest stops.
//
// Table format (default): a header naming the source, then per exit kind, device, register
// and vCPU: count, rate, total, min, p50, p99, p99.9, max; the slow exits with device and
// register names; the watchdog findings in time order with the I/Os in flight at the time;
// the embedder's per-vCPU counters (in-kernel exit counts from KVM binary stats); and the
// loss counters. JSON format: the same content, schema in docs/inspect.md.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "analysis/exit_summary.h"
#include "exitscope/dump.h"

namespace exitscope::report {

enum class OutputFormat { kTable, kJson };

struct ExitHealthOptions {
  OutputFormat format = OutputFormat::kTable;
  analysis::SummaryFilter filter;
  size_t max_rows = 20;     // rows per group table (0 = all); JSON always has all
  size_t max_notable = 50;  // slow exits / findings listed (0 = all); JSON always has all
  std::string source;       // what the dump came from ("vm.esdump", "live snapshot")
};

// Renders the report to a string.
std::string ExitHealthReport(const Dump& dump, const ExitHealthOptions& options);

// Writes ExitHealthReport(dump, options) to `out`.
void WriteExitHealthReport(const Dump& dump, const ExitHealthOptions& options, std::FILE* out);

}  // namespace exitscope::report
