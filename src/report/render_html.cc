// report/render_html.cc: --format html, one self-contained page with plots
// (docs/html-report.md).
#include <fmt/format.h>

#include "report/html_report.h"
#include "report/render_text.h"

namespace exitscope::report {
namespace {

Result<std::string> Html(const ReportModel& m) {
  if (std::string_view why = HtmlUnavailable(); !why.empty()) {
    return Fail(ErrorCode::kUnsupported, fmt::format("--format html: {}", why));
  }
  return ByModel(
      m,
      [](const HealthModel& h) -> Result<std::string> {
        return RenderExitHealthHtml(*h.dump, h.options);
      },
      [](const KvmModel& k) -> Result<std::string> {
        if (k.exits == nullptr && k.context.offcpu == nullptr) {
          return Fail(ErrorCode::kInvalidArgument, "--format html: not for a live report");
        }
        return RenderKvmHtml(*k.analysis, k.context, k.render, k.exits, k.slow_rule);
      },
      [](const JointModel& j) -> Result<std::string> {
        return RenderJointHtml(*j.dump, *j.view, j.options);
      });
}

}  // namespace

const Renderer kHtmlRenderer{
    .name = "html", .help = "one page with plots (needs -o FILE)", .file = true, .text = Html};

}  // namespace exitscope::report
