// report/diagnosis_report.h: the diagnosis (analysis/diagnosis.h) as the first lines of every
// text report, as the "diagnosis" object of every JSON report, and as the top of the HTML
// page (docs/diagnosis.md shows one and documents the JSON).
//
//   Diagnosis: vCPU 1 lost 74.8 % and vCPU 0 lost 68.4 % of the run, most of it to 23 slow
//   nvme0.SQ2TDBL write / nvme0.SQ1TDBL write exits of ~300.33 ms, each with an nvme0 I/O in
//   flight
//     run 4.852 s, 2 vCPUs, 2197 exits; slow: the recorder's threshold (20.00 ms) or ...
//     vCPU 0  lost 3.32 s (68.4 %), 3.31 s of it in slow or stuck exits; idle in HLT 824.95 ms
//     ...
//     What took the time, largest first
//      1. nvme0.SQ2TDBL write, slow: 12 exits, 3.61 s (37.2 % of the run), vCPU 1
//         typical 300.33 ms, p90 300.33 ms, worst 301.56 ms; first +0.306 s, last +3.937 s
//         evidence: an nvme0 I/O in flight through 12 of 12 (typical age at the exit's end ...)
//         next: exitscope inspect blk.esdump --events --device nvme0
//
// (testdata/kvm-host/blk-backend-delay.esdump, docs/diagnosis.md.)
// At most `max_groups` causes are listed (every slow or open one among them first in rank);
// the others are one "... N more causes" line. A run with nothing slow and nothing stuck is one
// line: "Diagnosis: all well: ...".
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>

#include "analysis/diagnosis.h"

namespace exitscope::report {

struct DiagnosisTextOptions {
  std::string slow_rule;  // what made an exit slow, in words ("the recorder's threshold 20 ms")
  // Where to look next: the command that lists a cause's exits one by one, to which
  // " --device NAME" is added for a device's cause ("exitscope inspect F --events"); empty:
  // no "next" line.
  std::string events_command;
  std::string next_hint;     // a "next" line for every cause where events_command is empty
  std::string lost_meaning;  // how the time was measured ("time inside exits, the VMM's
                             // handler", "the kernel's exit time"); shown once
  size_t max_groups = 6;
  // One line the command adds under the headline, whatever the causes: `kvm stat --bpf
  // --stacks`'s slowest exit seen from the kernel, where it blocked (offcpu_report.h). The
  // text and the page show it; kvm's JSON adds it to its "diagnosis" (RenderKvmJson).
  std::string seen_from_kernel;
};

// The one-line answer: "vCPU 0 lost 68.8 % and vCPU 1 75.0 % of the run, most of it to ...",
// or "all well: ...".
std::string DiagnosisHeadline(const analysis::Diagnosis& d, const DiagnosisTextOptions& o);

// The text block, ending with a blank line.
std::string DiagnosisText(const analysis::Diagnosis& d, const DiagnosisTextOptions& o);

// One evidence in words: "an nvme0 I/O in flight through 12 of 12 (typical age at the exit's
// end 300.4 ms)".
std::string EvidenceText(const analysis::DiagnosisEvidence& e, uint64_t group_count);

// The "next" line of a cause ("" when the options give none).
std::string NextStep(const analysis::DiagnosisGroup& g, const DiagnosisTextOptions& o);

// The JSON object (docs/json.md "diagnosis").
nlohmann::json DiagnosisJson(const analysis::Diagnosis& d, const DiagnosisTextOptions& o);

}  // namespace exitscope::report
