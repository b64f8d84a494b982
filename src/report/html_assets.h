// report/html_assets.h: what the HTML report inlines besides its data, embedded in the binary
// at build time (docs/html-report.md): the plotting library (web/npm_ci.cmake runs `npm ci`
// of web/package-lock.json into the build directory and generates its definitions), and the
// page's own style and script (web/report.css and web/report.js, embedded by
// web/embed_page.cmake).
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

// web/report.css and web/report.js as they were when this binary was built. The script
// builds each plot's ECharts option from the page's data block and draws nothing itself; it
// sets data-drawn="1" on a plot's element when ECharts reports the plot finished.
std::string_view ReportPageCss();
std::string_view ReportPageJs();

}  // namespace exitscope::report
