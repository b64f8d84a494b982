// report/render_timeline.cc: --format timeline, Trace Event JSON for ui.perfetto.dev
// (docs/timeline.md), streamed into the file while the inputs are replayed.
#include "report/render_text.h"

namespace exitscope::report {
namespace {

Status Timeline(const ReportModel& m, const std::string& path) {
  TimelineInputs in = m.timeline;
  if (m.joint != nullptr) in.joint = m.joint->view;
  if (m.kvm != nullptr && in.dump == nullptr && in.trace == nullptr)
    in.offcpu = m.kvm->context.offcpu;  // kvm stat --bpf --stacks
  auto st = WriteTimeline(in, m.timeline_options, path.empty() ? "-" : path);
  if (!st) return Propagate(st);
  return {};
}

}  // namespace

const Renderer kTimelineRenderer{.name = "timeline",
                                 .help = "Trace Event JSON for ui.perfetto.dev (needs -o FILE)",
                                 .file = true,
                                 .write = Timeline};

}  // namespace exitscope::report
