// report/kvm_report.h: renders a KvmAnalysis as perf kvm stat's table, JSON or CSV, with
// optional percentile columns and log-scale latency histograms.
//
// The table keeps perf kvm stat report's layout column for column (a reader who knows perf
// finds everything where it was), then appends what perf lacks: p50/p99/p99.9 columns
// (--percentiles) and a name column (device.register for ports and MMIO, MSR names, raw
// hypercall reasons). The JSON schema is documented in docs/kvm.md ("schema": 1); a row is the
// one row object of docs/json.md (row_json.h), the same as inspect's.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/diagnosis.h"
#include "analysis/kvm_stats.h"
#include "analysis/offcpu_exits.h"
#include "report/diagnosis_report.h"
#include "sources/kvm_pairing.h"

namespace exitscope::report {

// Everything about the input a report states besides its rows.
struct KvmReportContext {
  std::string input{};   // file name, or "live"
  std::string format{};  // "trace-cmd .dat", "trace-cmd report", "perf script", ...
  std::string clock{};   // the capture's trace clock
  uint64_t tsc_khz = 0;  // used to convert x86-tsc timestamps (0: not converted)
  bool tsc_khz_from_host = false;
  uint64_t lost_at_record = 0;  // overruns the capture recorded (trace-cmd CPUSTAT)
  const sources::KvmPairingStats* pairing = nullptr;
  int64_t pid = -1;
  int64_t vcpu = -1;
  bool list_slow_exits = false;  // JSON "slow_exits": the analysis's slow exits (kvm report)
  // The diagnosis the report opens with (table, json, html); null: none (a caller that made
  // none).
  const analysis::Diagnosis* diagnosis = nullptr;
  DiagnosisTextOptions diagnosis_text{};
  // `kvm stat --bpf --stacks`: the slow exits seen from the kernel, with their stacks (table:
  // a section, JSON: "kernel_slow_exits", HTML: a section); null: none.
  const analysis::OffCpuSlowExits* offcpu = nullptr;
};

struct KvmRenderOptions {
  analysis::KvmSortKey sort = analysis::KvmSortKey::kSample;
  bool percentiles = false;
  bool histogram = false;
  bool per_vm = false;
  bool per_vcpu = false;
};

std::string RenderKvmTable(const analysis::KvmAnalysis& a, const KvmReportContext& ctx,
                           const KvmRenderOptions& opts);
std::string RenderKvmJson(const analysis::KvmAnalysis& a, const KvmReportContext& ctx,
                          const KvmRenderOptions& opts);
std::string RenderKvmCsv(const analysis::KvmAnalysis& a, const KvmReportContext& ctx,
                         const KvmRenderOptions& opts);

// The CSV of rows, shared by every report (docs/json.md "CSV"): the header line, and one
// line per row of `table` in `order`, its first column `scope` ("all", "vm", "kind", ...).
std::string_view CsvHeader();
// A CSV field: as it is, or quoted ("a,b" -> "\"a,b\"", quotes doubled) when it holds a comma,
// a quote or a newline.
std::string CsvField(std::string_view s);
void AppendCsvRows(std::string& out, std::string_view scope, const analysis::ExitTable& table,
                   analysis::RowOrder order);

// The log-scale histogram of one row: one line per power-of-two latency bin from the row's
// min to its max, with a bar scaled to the fullest bin.
std::string RenderKvmHistogram(const analysis::KvmRow& row, int bar_width = 40);

// One line for an exit slower than --duration, as perf prints them, plus sub-key and device:
// "4396959646611 VM 16330, vcpu 0: IO 0x3f8:POUT (com1.THR) event took 39usec".
std::string FormatKvmSlowExit(const ExitEvent& e, std::string_view key);

}  // namespace exitscope::report
