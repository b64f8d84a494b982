// report/render_json.cc: --format json, one JSON document per report (docs/json.md).
#include "report/render_text.h"

namespace exitscope::report {
namespace {

Result<std::string> Json(const ReportModel& m) {
  return ByModel(
      m,
      [](const HealthModel& h) -> Result<std::string> {
        ExitHealthOptions o = h.options;
        o.format = OutputFormat::kJson;
        return ExitHealthReport(*h.dump, o);
      },
      [](const KvmModel& k) -> Result<std::string> {
        return RenderKvmJson(*k.analysis, k.context, k.render);
      },
      [](const JointModel& j) -> Result<std::string> {
        return RenderJointJson(*j.view, j.options);
      });
}

}  // namespace

const Renderer kJsonRenderer{
    .name = "json", .help = "one JSON document", .live = true, .text = Json};

}  // namespace exitscope::report
