// report/html_assets.h: the plotting library the HTML report inlines, embedded in the binary
// at build time (web/npm_ci.cmake runs `npm ci` of web/package-lock.json into the build
// directory and generates the definitions; docs/html-report.md).
#pragma once

#include <string_view>

namespace exitscope::report {

// "Apache ECharts 6.1.0"; empty when the library is not in this build.
std::string_view PlotLibraryName();
// The minified library (dist/echarts.common.min.js); empty when not in this build.
std::string_view PlotLibraryJs();
// Its licence texts (ECharts' NOTICE and LICENSE, and those of the zrender and tslib code it
// bundles); empty when not in this build.
std::string_view PlotLibraryLicense();
// Empty when the library is in this build; else one line saying why it is not (npm missing,
// `npm ci` failed offline, ...).
std::string_view PlotLibraryMissing();

}  // namespace exitscope::report
