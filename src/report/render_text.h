// report/render_text.h: what the text renderers (render_table.cc, render_json.cc,
// render_csv.cc, render_html.cc) share: picking the one model a ReportModel holds.
#pragma once

#include <string>

#include "exitscope/status.h"
#include "report/renderer.h"

namespace exitscope::report {

// Calls the function for the model `m` holds; kInvalidArgument when it holds none.
template <class Health, class Kvm, class Joint>
Result<std::string> ByModel(const ReportModel& m, Health&& health, Kvm&& kvm, Joint&& joint) {
  if (m.health != nullptr) return health(*m.health);
  if (m.kvm != nullptr) return kvm(*m.kvm);
  if (m.joint != nullptr) return joint(*m.joint);
  return Fail(ErrorCode::kInvalidArgument, "nothing to render");
}

}  // namespace exitscope::report
