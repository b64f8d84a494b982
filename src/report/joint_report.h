// report/joint_report.h: renders a JointView (analysis/joint_view.h) as a table or as JSON
// (schema "exitscope.joint.v1", docs/joint.md).
#pragma once

#include <cstddef>
#include <string>

#include "analysis/joint_view.h"
#include "exitscope/dump.h"
#include "exitscope/status.h"
#include "report/diagnosis_report.h"

namespace exitscope::report {

struct JointRenderOptions {
  std::string dump;  // file names, as given
  std::string trace;
  size_t slow = 10;  // slow exits listed (top N by kernel duration)
  size_t rows = 20;  // rows per group table (0 = all)
  // JSON: matched exits listed one by one (0 = all); the rest are counted in
  // "exits_left_out". Unmatched exits are always all listed.
  size_t max_exits = 0;
  // The diagnosis's slow rule: kernel exit time at least this (the dump's slow-exit threshold);
  // 0: none is slow.
  uint64_t slow_ns = 0;
};

std::string RenderJointTable(const analysis::JointView& v, const JointRenderOptions& o);
// The words the joint view's diagnosis is given (its slow rule, what "lost" measures).
DiagnosisTextOptions JointDiagnosisText(const JointRenderOptions& o);
std::string RenderJointJson(const analysis::JointView& v, const JointRenderOptions& o);

}  // namespace exitscope::report
