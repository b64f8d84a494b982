// report/render_table.cc: --format table, the text report of each model.
#include "report/render_text.h"

namespace exitscope::report {
namespace {

Result<std::string> Table(const ReportModel& m) {
  return ByModel(
      m,
      [](const HealthModel& h) -> Result<std::string> {
        ExitHealthOptions o = h.options;
        o.format = OutputFormat::kTable;
        return ExitHealthReport(*h.dump, o);
      },
      [](const KvmModel& k) -> Result<std::string> {
        return RenderKvmTable(*k.analysis, k.context, k.render);
      },
      [](const JointModel& j) -> Result<std::string> {
        return RenderJointTable(*j.view, j.options);
      });
}

}  // namespace

const Renderer kTableRenderer{
    .name = "table", .help = "the text report", .live = true, .text = Table};

}  // namespace exitscope::report
