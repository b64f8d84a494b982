// report/row_json.h: the one JSON object of a row (analysis/exit_table.h ExitRow), used by
// every JSON output that has rows: `kvm report` / `kvm live` ("rows" of each group) and
// `inspect` / `run` ("by_kind", "by_device", "by_register", "by_vcpu"). Schema: docs/json.md.
#pragma once

#include <nlohmann/json.hpp>

#include "analysis/exit_table.h"

namespace exitscope::report {

// `table` is the row's table: samples_pct and time_pct are of its totals. `histogram` adds
// the power-of-two "histogram" bins.
nlohmann::json RowJson(const analysis::ExitRow& row, const analysis::ExitTable& table,
                       bool histogram);

}  // namespace exitscope::report
