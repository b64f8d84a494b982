// report/exit_health.h: the exit-health report over a recorder Dump (file or live snapshot):
// `exitscope inspect` prints it, and `exitscope run` prints it when the guest stops.
//
// Table format (default): a header naming the source, the diagnosis (report/diagnosis_report.h:
// what took each vCPU's time, by cause, with the evidence), then per exit kind, device, register
// and vCPU: count, rate, total, min, p50, p99, p99.9, max; the slow exits with device and
// register names and the watchdog findings, each repeat one line (options.events: one by one,
// in time order, with the I/Os in flight at the time and the stacks);
// the embedder's per-vCPU counters, one column per vCPU (the in-kernel exit counts from KVM
// binary stats first, in KvmExitCounterNames() order; the other non-zero counters after,
// every counter with --all); and the loss counters. JSON format: the same content with every
// event listed and the "diagnosis" object, schema in docs/inspect.md, its rows the one row
// object of docs/json.md (row_json.h).
//
// The tables are rows of the grouping engine (analysis/exit_table.h) built from the dump's
// event stream (sources/dump_source.h -> analysis::ExitSummaryBuilder), as the kvm tables are.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>

#include "analysis/diagnosis.h"
#include "analysis/exit_summary.h"
#include "exitscope/dump.h"
#include "report/diagnosis_report.h"

namespace exitscope::report {

enum class OutputFormat { kTable, kJson };

struct ExitHealthOptions {
  OutputFormat format = OutputFormat::kTable;
  analysis::SummaryFilter filter;
  // Rows per group table (0 = all, and then every per-vCPU counter, zeros included: what
  // `inspect --all` asks for). JSON always has all.
  size_t max_rows = 20;
  size_t max_notable = 50;  // slow exits / findings listed (0 = all); JSON always has all
  std::string source;       // what the dump came from ("vm.esdump", "live snapshot")
  // The slow exits and the findings one by one (`inspect --events`); else each repeat is one
  // line with its count, first and last time and distribution. JSON always lists each.
  bool events = false;
  // The command that lists the events one by one, for the diagnosis's "next" lines
  // ("exitscope inspect vm.esdump --events"); empty: none.
  std::string events_command;
};

// The KVM binary stats (without the "kvm." prefix the VMM stores them under) that count why
// the guest exited, in the order the report lists them: "exits", "halt_exits", "irq_exits",
// "insn_emulation", "mmio_exits", "io_exits", "pf_taken", ... Listed even when 0 (io_exits
// stays 0 on kvm-pvm: a 0 is a measurement).
std::span<const std::string_view> KvmExitCounterNames();

// Renders the report to a string.
std::string ExitHealthReport(const Dump& dump, const ExitHealthOptions& options);

// The table format of a summary and diagnosis already made (what ExitHealthReport prints for
// kTable).
std::string RenderExitHealthTable(const Dump& dump, const analysis::ExitSummary& summary,
                                  const analysis::Diagnosis& diagnosis,
                                  const ExitHealthOptions& options);

// The diagnosis of a dump's stream: the exits the summary counts under `filter`, slow by
// kDumpSlowRule (feed a DiagnosisBuilder with these options the summary's stream: Summarize's
// `also`).
analysis::DiagnosisOptions DumpDiagnosisOptions(const analysis::SummaryFilter& filter);
// The words the reports give a dump's diagnosis (slow rule, what "lost" measures, the next
// command).
DiagnosisTextOptions DumpDiagnosisText(const Dump& dump, const ExitHealthOptions& options);

// Writes ExitHealthReport(dump, options) to `out`.
void WriteExitHealthReport(const Dump& dump, const ExitHealthOptions& options, std::FILE* out);

}  // namespace exitscope::report
