// report/renderer.cc: the registry of output formats (renderer.h). One line per format.
#include "report/renderer.h"

#include <fmt/format.h>

#include "base/output_file.h"

namespace exitscope::report {
namespace {

constexpr const Renderer* kRenderers[] = {
    &kTableRenderer, &kJsonRenderer, &kCsvRenderer, &kHtmlRenderer, &kTimelineRenderer,
};

bool Offered(const Renderer& r, Need need) noexcept {
  return need == Need::kFile || r.live;
}

}  // namespace

std::span<const Renderer* const> Renderers() {
  return kRenderers;
}

std::string FormatChoices(Need need) {
  std::string out;
  for (const Renderer* r : kRenderers) {
    if (!Offered(*r, need)) continue;
    if (!out.empty()) out += " | ";
    out += r->name;
  }
  return out;
}

Result<const Renderer*> FindRenderer(std::string_view name, Need need) {
  std::string names;
  for (const Renderer* r : kRenderers) {
    if (!Offered(*r, need)) continue;
    if (r->name == name) return r;
    names += names.empty() ? "" : ", ";
    names += r->name;
  }
  return Fail(ErrorCode::kInvalidArgument,
              fmt::format("--format '{}': not one of {}", name, names));
}

Status WriteReport(const Renderer& r, const ReportModel& m, const std::string& path) {
  if (r.write != nullptr) return r.write(m, path);
  auto text = r.text(m);
  if (!text) return Propagate(text);
  const std::string p = path.empty() ? "-" : path;
  return base::WriteOutputFile(
      p, *text, {.label = p == "-" ? "standard output" : "-o " + p, .what = "a report"});
}

Result<std::string> RenderText(const Renderer& r, const ReportModel& m) {
  if (r.text == nullptr) {
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("--format {}: written to a file only", r.name));
  }
  return r.text(m);
}

}  // namespace exitscope::report
