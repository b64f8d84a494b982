// report/render_csv.cc: --format csv, the rows one line each (docs/json.md "CSV").
//
// A kvm report's rows as `kvm report` always wrote them (scope all / vm / vcpu); a dump's rows
// with the same columns, scope kind / device / register / vcpu, sorted by total time; the
// joint view's groups with each part's p50, p99 and sum.
#include <fmt/format.h>

#include "analysis/exit_summary.h"
#include "report/format.h"
#include "report/render_text.h"

namespace exitscope::report {
namespace {

std::string HealthCsv(const HealthModel& h) {
  const analysis::ExitSummary s = analysis::Summarize(*h.dump, h.options.filter);
  std::string out(CsvHeader());
  AppendCsvRows(out, "kind", s.by_kind, analysis::RowOrder::kTime);
  AppendCsvRows(out, "device", s.by_device, analysis::RowOrder::kTime);
  AppendCsvRows(out, "register", s.by_register, analysis::RowOrder::kTime);
  AppendCsvRows(out, "vcpu", s.by_vcpu, analysis::RowOrder::kTime);
  // The findings, one row each in time order: key the type, name the line as logged, samples
  // 1, time_ns its duration, stack its frames innermost first joined by " <- ".
  for (const analysis::KeptFinding& f : s.findings) {
    const bool on_vcpu = f.type != FindingType::kAgedIo;
    out +=
        fmt::format("finding,,{},{},{},1,,{},,,,,,,,,{}\n",
                    on_vcpu ? fmt::format("{}", f.vcpu) : "", ToString(f.type), CsvField(f.text),
                    f.duration_ns, f.stack != nullptr ? CsvField(JoinedStackFrames(*f.stack)) : "");
  }
  return out;
}

std::string JointCsv(const JointModel& j) {
  std::string out = "scope,key,count";
  for (const char* part : {"total", "before", "handler", "after", "off_cpu"}) {
    out += fmt::format(",{0}_p50_ns,{0}_p99_ns,{0}_sum_ns", part);
  }
  out += '\n';
  const analysis::JointGroups g = analysis::GroupJointExits(j.view->matched);
  const auto rows = [&out](std::string_view scope, const std::vector<analysis::JointGroup>& gs) {
    for (const analysis::JointGroup& r : gs) {
      out += fmt::format("{},{},{}", scope, CsvField(r.key), r.count);
      for (const analysis::JointPart* p : {&r.total, &r.before, &r.handler, &r.after, &r.off_cpu}) {
        out += fmt::format(",{},{},{}", p->p50_ns, p->p99_ns, p->sum_ns);
      }
      out += '\n';
    }
  };
  rows("kind", g.by_kind);
  rows("device", g.by_device);
  rows("register", g.by_register);
  return out;
}

Result<std::string> Csv(const ReportModel& m) {
  return ByModel(
      m, [](const HealthModel& h) -> Result<std::string> { return HealthCsv(h); },
      [](const KvmModel& k) -> Result<std::string> {
        return RenderKvmCsv(*k.analysis, k.context, k.render);
      },
      [](const JointModel& j) -> Result<std::string> { return JointCsv(j); });
}

}  // namespace

const Renderer kCsvRenderer{
    .name = "csv", .help = "the rows, one line each", .live = true, .text = Csv};

}  // namespace exitscope::report
