#include "report/kvm_report.h"

#include <algorithm>
#include <bit>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "report/format.h"
#include "report/offcpu_report.h"
#include "report/row_json.h"
#include "sources/kvm_trace.h"

namespace exitscope::report {
namespace {

using analysis::KvmAnalysis;
using analysis::KvmGroup;
using analysis::KvmRow;
using base::LatencyHistogram;

constexpr int kDecodeWidth = 20;  // perf's decode_str_len

double UsecOf(uint64_t ns) {
  return static_cast<double>(ns) / 1e3;
}

bool AccessClass(analysis::KvmEventClass c) {
  return c == analysis::KvmEventClass::kIoport || c == analysis::KvmEventClass::kMmio ||
         c == analysis::KvmEventClass::kMsr || c == analysis::KvmEventClass::kHypercall;
}

// "-" in place of a time the trace does not show, right-aligned in `width` (plus the "us").
std::string UnknownTime(int width) {
  return fmt::format("{:>{}}", "-", width + 2);
}

// The notes that explain counts without a time, shared by the table and the JSON.
std::vector<std::string> Notes(const KvmAnalysis& a, const KvmReportContext& ctx) {
  std::vector<std::string> notes;
  const sources::KvmPairingStats* p = ctx.pairing;
  const uint64_t no_end = p != nullptr ? p->exits_time_unknown : 0;
  const uint64_t in_kernel = p != nullptr ? p->kernel_accesses : 0;
  if (no_end != 0 || (p == nullptr && a.all.untimed != 0)) {
    notes.push_back(fmt::format(
        "Time unknown: {} exits have a kvm_exit and no kvm_entry on their thread (the trace "
        "has no entries, e.g. `trace-cmd report | grep kvm_exit`): they are counted in "
        "Samples and Samples% by reason, but their time is unknown (\"-\"; not in Time% or "
        "the time columns).",
        no_end));
  }
  if (in_kernel != 0) {
    notes.push_back(fmt::format(
        "Handled in the kernel: {} accesses (kvm_pio / kvm_mmio / kvm_msr / kvm_hypercall) had "
        "no exit to userspace of their own (QEMU-coalesced PIO/MMIO such as the RTC index "
        "port 0x70, ioeventfd doorbells, in-kernel PIT/IOAPIC/LAPIC, in-kernel MSRs). This "
        "trace has no kvm_exit, so they have no time: --event ioport|mmio|msr|hypercall count "
        "them in Samples and \"In kernel\", the exit tables (vmexit, userspace) leave them "
        "out.",
        in_kernel));
  }
  if (a.open_at_end != 0) {
    notes.push_back(fmt::format(
        "Open at end of trace: {} exits started and the vCPU had not re-entered the guest when "
        "the trace ended (e.g. the exit that ends the guest): listed below, not in Samples or "
        "the time columns.",
        a.open_at_end));
  }
  return notes;
}

std::string ScopeLine(const KvmReportContext& ctx, int64_t vm, int64_t vcpu) {
  std::string s = "Analyze events for ";
  if (vm >= 0)
    s += fmt::format("VM {}, ", vm);
  else if (ctx.pid >= 0)
    s += fmt::format("pid(s) {}, ", ctx.pid);
  else
    s += "all VMs, ";
  const int64_t v = vcpu >= 0 ? vcpu : ctx.vcpu;
  if (v >= 0)
    s += fmt::format("VCPU {}:", v);
  else
    s += "all VCPUs:";
  return s;
}

void AppendTable(std::string& out, const KvmAnalysis& a, const KvmGroup& g,
                 const KvmReportContext& ctx, const KvmRenderOptions& opts) {
  const auto rows = analysis::SortedRows(g, opts.sort);
  bool any_name = false;
  for (const KvmRow* r : rows) any_name |= !r->name.empty();
  const bool access = AccessClass(a.event);

  out += "\n\n";
  out += ScopeLine(ctx, g.vm, g.vcpu);
  out += "\n\n";
  out += fmt::format("{:>{}} ", analysis::KvmEventTitle(a.event), kDecodeWidth);
  out += fmt::format("{:>10} {:>9} {:>9} {:>11} {:>11} {:>16} ", "Samples", "Samples%", "Time%",
                     "Min Time", "Max Time", "Avg time");
  if (opts.percentiles) out += fmt::format("  {:>11} {:>11} {:>11} ", "p50", "p99", "p99.9");
  if (access) out += fmt::format("  {:>8} {:>9} ", "To VMM", "In kernel");
  if (any_name) out += " Name";
  out += "\n\n";
  for (const KvmRow* r : rows) {
    const auto& s = r->stats;
    const bool timed = s.count() != 0;
    out += fmt::format("{:>{}} ", r->key, kDecodeWidth);
    out += fmt::format("{:>10} ", r->samples());
    out += fmt::format("{:8.2f}% ", PercentOf(r->samples(), g.samples));
    if (timed) {
      out += fmt::format("{:8.2f}% ", PercentOf(s.sum(), g.time_ns));
      out += fmt::format("{:9.2f}us ", UsecOf(s.min()));
      out += fmt::format("{:9.2f}us ", UsecOf(s.max()));
      out += fmt::format("{:9.2f}us ( +-{:7.2f}% )", s.mean() / 1e3, s.RelStdErrPercent());
    } else {
      out += fmt::format("{:>9} {} {} {}  {:>12}", "-", UnknownTime(9), UnknownTime(9),
                         UnknownTime(9), "");
    }
    if (opts.percentiles) {
      if (timed) {
        out += fmt::format("  {:9.2f}us {:9.2f}us {:9.2f}us", UsecOf(s.Quantile(0.5)),
                           UsecOf(s.Quantile(0.99)), UsecOf(s.Quantile(0.999)));
      } else {
        out += fmt::format("  {} {} {}", UnknownTime(9), UnknownTime(9), UnknownTime(9));
      }
    }
    if (access) out += fmt::format("  {:>8} {:>9}", r->to_vmm(), r->in_kernel);
    if (!r->name.empty()) out += fmt::format("  {}", r->name);
    out += "\n";
  }
  out += fmt::format("\nTotal Samples:{}, Total events handled time:{:.2f}us.\n", g.samples,
                     UsecOf(g.time_ns));
  if (g.untimed != 0) {
    out += fmt::format("({} of the {} samples have no time: see the notes below.)\n", g.untimed,
                       g.samples);
  }
  if (opts.histogram) {
    for (const KvmRow* r : rows) {
      out += "\n";
      out += RenderKvmHistogram(*r);
    }
  }
}

void AppendFooter(std::string& out, const KvmAnalysis& a, const KvmReportContext& ctx,
                  const KvmRenderOptions& opts) {
  out +=
      "\nNote: \"+-\" is the standard error of the mean relative to the mean (as perf kvm "
      "stat prints it), not the spread";
  out += opts.percentiles ? fmt::format(
                                "; percentiles come from a log-linear histogram (<= {:.2f}% "
                                "relative error).\n",
                                100.0 * LatencyHistogram::kMaxRelativeError)
                          : ".\n";
  if (ctx.tsc_khz != 0) {
    out += fmt::format("Clock: {} timestamps converted at {:.3f} MHz{}.\n", ctx.clock,
                       static_cast<double>(ctx.tsc_khz) / 1e3,
                       ctx.tsc_khz_from_host ? " (this host's TSC; set --tsc-mhz for the "
                                               "capture host's)"
                                             : "");
  }
  for (const std::string& n : Notes(a, ctx)) out += n + "\n";
  constexpr size_t kOpenLines = 20;
  for (size_t i = 0; i < a.open_exits.size() && i < kOpenLines; ++i) {
    const analysis::KeptExit& e = a.open_exits[i];
    std::string line = fmt::format("  open at end of trace: {} VM {}, vcpu {}: {}", e.start_ns,
                                   e.vm, e.vcpu, e.reason);
    if (!e.key.empty() && e.key != e.reason) line += " " + e.key;
    if (!e.device.empty()) {
      line +=
          e.reg.empty() ? fmt::format(" ({})", e.device) : fmt::format(" ({}.{})", e.device, e.reg);
    }
    out += line + ", started and never re-entered\n";
  }
  if (a.open_at_end > kOpenLines) {
    out += fmt::format("  ... and {} more open at end of trace\n", a.open_at_end - kOpenLines);
  }
  if (const sources::KvmPairingStats* p = ctx.pairing) {
    out += fmt::format(
        "Input: {} ({}), {} records, {} exits paired ({} kvm_exit->kvm_entry, {} reached "
        "userspace), {} open at end of trace, {} exits without a time, {} accesses handled in "
        "the kernel.\n",
        ctx.input, ctx.format, p->records_total, p->paired(), p->kernel_exits, p->userspace_exits,
        p->open_at_end, p->exits_time_unknown, p->kernel_accesses);
    out += fmt::format(
        "Not paired: {} exits without an end ({} of them open at end of trace), {} entries "
        "without an exit, {} child records outside any exit; lost: {} records in {} "
        "overruns{}.\n",
        p->unpaired_exits, p->open_at_end, p->entries_without_exit, p->children_outside_exit,
        p->lost_events, p->lost_markers,
        ctx.lost_at_record ? fmt::format(" (+{} overrun while recording)", ctx.lost_at_record)
                           : std::string());
    if (p->exits == 0 && p->records[static_cast<size_t>(sources::KvmEventType::kExit)] == 0 &&
        p->records[static_cast<size_t>(sources::KvmEventType::kUserspaceExit)] == 0) {
      out +=
          "No kvm_exit or kvm_userspace_exit records: nothing to pair (were kvm events "
          "enabled?).\n";
    }
  } else if (!ctx.input.empty()) {  // a recorder dump: exits as the VMM timed them, no pairing
    out +=
        fmt::format("Input: {} ({}), {} exits as the VMM recorded them (each reached userspace).\n",
                    ctx.input, ctx.format, a.exits_seen);
  }
  if (a.exits_filtered != 0) {
    out += fmt::format("{} of {} exits not in --event {} or filtered by --vcpu / -p.\n",
                       a.exits_filtered, a.exits_seen, analysis::ToString(a.event));
  }
  if (a.kernel_accesses_skipped != 0) {
    out += fmt::format(
        "{} of {} accesses handled in the kernel not in --event {} or filtered by --vcpu / "
        "-p.\n",
        a.kernel_accesses_skipped, a.kernel_accesses_seen, analysis::ToString(a.event));
  }
}

nlohmann::json GroupJson(const KvmGroup& g, const KvmRenderOptions& opts) {
  nlohmann::json j;
  if (g.vm >= 0) j["vm"] = g.vm;
  if (g.vcpu >= 0) j["vcpu"] = g.vcpu;
  j["samples"] = g.samples;
  j["time_ns"] = g.time_ns;
  j["untimed_samples"] = g.untimed;
  j["in_kernel"] = g.in_kernel;
  nlohmann::json rows = nlohmann::json::array();
  for (const KvmRow* r : analysis::SortedRows(g, opts.sort))
    rows.push_back(RowJson(*r, g, opts.histogram));
  j["rows"] = std::move(rows);
  return j;
}

}  // namespace

std::string_view CsvHeader() {
  return "scope,vm,vcpu,key,name,samples,samples_pct,time_ns,time_pct,min_ns,max_ns,mean_ns,"
         "stderr_pct,p50_ns,p99_ns,p999_ns,stack\n";
}

std::string CsvField(std::string_view s) {
  if (s.find_first_of(",\"\n") == std::string_view::npos) return std::string(s);
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

void AppendCsvRows(std::string& out, std::string_view scope, const analysis::ExitTable& g,
                   analysis::RowOrder order) {
  const auto quote = CsvField;
  for (const KvmRow* r : analysis::SortedRows(g, order)) {
    const auto& s = r->stats;
    out += fmt::format("{},{},{},{},{},{},{:.4f},{},{:.4f},{},{},{:.1f},{:.4f},{},{},{},\n", scope,
                       g.vm >= 0 ? fmt::format("{}", g.vm) : "",
                       g.vcpu >= 0 ? fmt::format("{}", g.vcpu) : "", quote(r->key), quote(r->name),
                       s.count(), PercentOf(s.count(), g.samples), s.sum(),
                       PercentOf(s.sum(), g.time_ns), s.min(), s.max(), s.mean(),
                       s.RelStdErrPercent(), s.Quantile(0.5), s.Quantile(0.99), s.Quantile(0.999));
  }
}

std::string RenderKvmHistogram(const KvmRow& row, int bar_width) {
  const LatencyHistogram& h = row.stats.histogram();
  std::string out = fmt::format("{} ({} samples)\n", row.key, h.count());
  if (h.count() == 0) return out;
  // Power-of-two bins covering [min, max].
  const auto top_bit = [](uint64_t v) {
    return v == 0 ? 0 : static_cast<int>(std::bit_width(v)) - 1;
  };
  const int lo_bit = top_bit(h.min());
  const int hi_bit = std::max(lo_bit, top_bit(h.max()));
  std::vector<uint64_t> bins(static_cast<size_t>(hi_bit - lo_bit + 1), 0);
  for (size_t b = 0; b < LatencyHistogram::kBuckets; ++b) {
    const uint64_t c = h.bucket_count(b);
    if (c == 0) continue;
    const uint64_t v = LatencyHistogram::BucketLow(b);
    const int bit = top_bit(v);
    const int idx = std::clamp(bit, lo_bit, hi_bit) - lo_bit;
    bins[static_cast<size_t>(idx)] += c;
  }
  const uint64_t peak = *std::max_element(bins.begin(), bins.end());
  for (size_t i = 0; i < bins.size(); ++i) {
    const int bit = lo_bit + static_cast<int>(i);
    const uint64_t from = bit == 0 && lo_bit == 0 ? 0 : uint64_t{1} << bit;
    const uint64_t to = uint64_t{1} << (bit + 1);
    const int len =
        peak ? static_cast<int>((bins[i] * static_cast<uint64_t>(bar_width) + peak - 1) / peak) : 0;
    out += fmt::format("  {:>10} - {:<10} |{:<{}}| {:>10} {:6.2f}%\n", FormatDurationNs(from),
                       FormatDurationNs(to), std::string(static_cast<size_t>(len), '#'), bar_width,
                       bins[i], PercentOf(bins[i], h.count()));
  }
  return out;
}

std::string RenderKvmTable(const KvmAnalysis& a, const KvmReportContext& ctx,
                           const KvmRenderOptions& opts) {
  std::string out;
  if (ctx.diagnosis != nullptr) {
    out += DiagnosisText(*ctx.diagnosis, ctx.diagnosis_text);
    out.pop_back();  // the table opens with its own blank line
  }
  AppendTable(out, a, a.all, ctx, opts);
  if (opts.per_vm) {
    for (const auto& g : a.per_vm) AppendTable(out, a, *g, ctx, opts);
  }
  if (opts.per_vcpu) {
    for (const auto& g : a.per_vcpu) AppendTable(out, a, *g, ctx, opts);
  }
  AppendFooter(out, a, ctx, opts);
  if (ctx.offcpu != nullptr) out += OffCpuSectionText(*ctx.offcpu);
  return out;
}

std::string RenderKvmJson(const KvmAnalysis& a, const KvmReportContext& ctx,
                          const KvmRenderOptions& opts) {
  nlohmann::json j;
  j["schema"] = 1;
  j["tool"] = "exitscope kvm report";
  j["input"] = {{"file", ctx.input},
                {"format", ctx.format},
                {"clock", ctx.clock},
                {"tsc_khz", ctx.tsc_khz},
                {"tsc_khz_from_host", ctx.tsc_khz_from_host}};
  j["event"] = analysis::ToString(a.event);
  if (ctx.diagnosis != nullptr) {
    j["diagnosis"] = DiagnosisJson(*ctx.diagnosis, ctx.diagnosis_text);
    if (!ctx.diagnosis_text.seen_from_kernel.empty())  // kvm stat --bpf --stacks
      j["diagnosis"]["seen_from_kernel"] = ctx.diagnosis_text.seen_from_kernel;
  }
  j["filters"] = {{"pid", ctx.pid >= 0 ? nlohmann::json(ctx.pid) : nlohmann::json(nullptr)},
                  {"vcpu", ctx.vcpu >= 0 ? nlohmann::json(ctx.vcpu) : nlohmann::json(nullptr)}};
  j["all"] = GroupJson(a.all, opts);
  if (opts.per_vm) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& g : a.per_vm) arr.push_back(GroupJson(*g, opts));
    j["per_vm"] = std::move(arr);
  }
  if (opts.per_vcpu) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& g : a.per_vcpu) arr.push_back(GroupJson(*g, opts));
    j["per_vcpu"] = std::move(arr);
  }
  j["exits_seen"] = a.exits_seen;
  j["exits_filtered"] = a.exits_filtered;
  j["slow_exit_count"] = a.slow_exits;
  j["open_at_end_count"] = a.open_at_end;
  {
    nlohmann::json arr = nlohmann::json::array();
    for (const analysis::KeptExit& e : a.open_exits) {
      arr.push_back({{"start_ns", e.start_ns},
                     {"vm", e.vm},
                     {"vcpu", e.vcpu},
                     {"tid", e.tid},
                     {"reason", e.reason},
                     {"key", e.key},
                     {"device", e.device},
                     {"register", e.reg}});
    }
    j["open_at_end"] = std::move(arr);
  }
  j["kernel_accesses_seen"] = a.kernel_accesses_seen;
  j["kernel_accesses_skipped"] = a.kernel_accesses_skipped;
  j["notes"] = Notes(a, ctx);
  if (ctx.list_slow_exits) {
    nlohmann::json arr = nlohmann::json::array();
    for (const analysis::KeptExit& e : a.slow) {
      arr.push_back({{"start_ns", e.start_ns},
                     {"duration_ns", e.duration_ns},
                     {"vm", e.vm},
                     {"vcpu", e.vcpu},
                     {"tid", e.tid},
                     {"reason", e.reason},
                     {"key", e.key},
                     {"device", e.device},
                     {"register", e.reg}});
    }
    j["slow_exits"] = std::move(arr);
  }
  if (ctx.offcpu != nullptr) {
    nlohmann::json arr = nlohmann::json::array();
    for (const analysis::OffCpuSlowExit& e : ctx.offcpu->exits()) arr.push_back(OffCpuExitJson(e));
    j["kernel_slow_exits"] = std::move(arr);
    j["kernel_slow_exits_seen"] = ctx.offcpu->seen();
    j["kernel_slow_exits_left_out"] = ctx.offcpu->left_out();
    j["kernel_slow_ns"] = ctx.offcpu->options().slow_ns;
    j["symbolizer_notes"] = ctx.offcpu->notes();
  }
  if (const sources::KvmPairingStats* p = ctx.pairing) {
    nlohmann::json rec = nlohmann::json::object();
    for (size_t i = 0; i < sources::kKvmEventTypeCount; ++i) {
      rec[std::string(sources::KvmEventName(static_cast<sources::KvmEventType>(i)))] =
          p->records[i];
    }
    j["pairing"] = {{"records", std::move(rec)},
                    {"records_total", p->records_total},
                    {"exits", p->exits},
                    {"paired", p->paired()},
                    {"open_at_end", p->open_at_end},
                    {"exits_time_unknown", p->exits_time_unknown},
                    {"kernel_accesses", p->kernel_accesses},
                    {"kernel_exits", p->kernel_exits},
                    {"userspace_exits", p->userspace_exits},
                    {"unpaired_exits", p->unpaired_exits},
                    {"entries_without_exit", p->entries_without_exit},
                    {"children_outside_exit", p->children_outside_exit},
                    {"completions", p->completions},
                    {"failed_vmentry", p->failed_vmentry},
                    {"lost_events", p->lost_events},
                    {"lost_markers", p->lost_markers},
                    {"lost_at_record", ctx.lost_at_record}};
  }
  // Names come from the input (comm, file names, reasons as printed): never abort on bytes
  // that are not UTF-8, replace them with U+FFFD.
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string RenderKvmCsv(const KvmAnalysis& a, const KvmReportContext& ctx,
                         const KvmRenderOptions& opts) {
  (void)ctx;
  std::string out(CsvHeader());
  AppendCsvRows(out, "all", a.all, opts.sort);
  if (opts.per_vm) {
    for (const auto& g : a.per_vm) AppendCsvRows(out, "vm", *g, opts.sort);
  }
  if (opts.per_vcpu) {
    for (const auto& g : a.per_vcpu) AppendCsvRows(out, "vcpu", *g, opts.sort);
  }
  return out;
}

std::string FormatKvmSlowExit(const ExitEvent& e, std::string_view key) {
  std::string s = fmt::format("{} VM {}, vcpu {}: {}", e.start_ns, e.vm, e.vcpu, e.reason);
  if (!key.empty() && key != e.reason) s += fmt::format(" {}", key);
  if (!e.device.empty()) {
    s += e.reg.empty() ? fmt::format(" ({})", e.device) : fmt::format(" ({}.{})", e.device, e.reg);
  }
  s += fmt::format(" event took {}usec", e.duration_ns / 1000);
  return s;
}

}  // namespace exitscope::report
