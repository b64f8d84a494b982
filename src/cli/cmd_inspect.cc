// `exitscope inspect DUMP`: the exit-health report of a recorder dump.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "cli/commands.h"
#include "cli/parse_args.h"
#include "exitscope/dump.h"
#include "report/exit_health.h"
#include "report/html_report.h"
#include "report/joint_report.h"

namespace exitscope::cli {

int InspectMain(int argc, char** argv) {
  CLI::App app{
      "Summarise a recorder dump (.esdump): exits per kind, device, register and vCPU with\n"
      "count, total time, min, p50, p99, p99.9, max; the slow exits and watchdog findings in\n"
      "time order (with the I/Os in flight at each finding); lost-record counters.",
      argv[0]};
  std::string path, format = "table";
  int64_t vcpu = -1;
  std::string device;
  size_t rows = 20;
  bool all = false;
  app.add_option("DUMP", path,
                 "dump file written by the recorder (WriteDump, signal, exitscope run)")
      ->required();
  app.add_option("--format", format, "output format")
      ->check(CLI::IsMember({"table", "json", "html"}))
      ->capture_default_str();
  std::string output;
  app.add_option("-o,--output", output,
                 "write the report to FILE ('-' or none: stdout); --format html needs it");
  app.add_option("--vcpu", vcpu, "only exits of this vCPU")->check(kNonNegativeInteger);
  app.add_option("--device", device, "only exits on this device (a name, or 'unassigned')");
  app.add_option("--rows", rows, "rows per table in table format (0 = all)")
      ->check(kNonNegativeInteger)
      ->capture_default_str();
  app.add_flag("--all", all, "list every row, slow exit and finding");
  std::string kernel;
  app.add_option("--kernel", kernel,
                 "the joint view: match the dump's exits with a kernel trace of the same run "
                 "(x86-tsc clock, e.g. from `exitscope kvm record`) and split each exit's "
                 "time (docs/joint.md)");
  app.footer(
      "Exit status: 0 ok, 1 a runtime failure (e.g. a read error), 2 bad usage or a missing, "
      "corrupt or unsupported dump.\n"
      "JSON schema: docs/inspect.md. HTML (one self-contained page with plots): "
      "docs/html-report.md.");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;
  const bool html = format == "html";
  if (html && output.empty()) {
    return UsageError("exitscope inspect",
                      "--format html: give the page's file with -o FILE (-o - for stdout)");
  }
  if (html && !report::HtmlUnavailable().empty()) {
    std::fprintf(stderr, "exitscope inspect: --format html: %s\n",
                 report::HtmlUnavailable().data());
    return 1;
  }

  auto dump = ReadDump(path);
  if (!dump) {
    return ReportError("exitscope inspect", dump.error());
  }
  if (!kernel.empty()) {
    if (vcpu >= 0 || !device.empty()) {
      return UsageError("exitscope inspect", "--kernel: --vcpu and --device do not apply");
    }
    report::JointRenderOptions jo;
    jo.dump = path;
    jo.trace = kernel;
    jo.rows = all ? 0 : rows;
    auto out = html ? report::RenderJointHtml(*dump, jo)
                    : report::RenderJointViewOfFiles(*dump, jo, format == "json");
    if (!out) return ReportError("exitscope inspect", out.error());
    if (Status s = WriteOutput(output, *out); !s)
      return ReportError("exitscope inspect", s.error());
    return 0;
  }
  report::ExitHealthOptions o;
  o.format = format == "json" ? report::OutputFormat::kJson : report::OutputFormat::kTable;
  o.source = path;
  o.max_rows = all ? 0 : rows;
  o.max_notable = all ? 0 : 50;
  if (vcpu >= 0) {
    if (static_cast<uint64_t>(vcpu) >= dump->vcpus.size()) {
      std::fprintf(stderr, "exitscope inspect: --vcpu %lld: the dump has %zu vCPUs (0..%zu)\n",
                   static_cast<long long>(vcpu), dump->vcpus.size(),
                   dump->vcpus.empty() ? 0 : dump->vcpus.size() - 1);
      return 2;
    }
    o.filter.vcpu = static_cast<uint32_t>(vcpu);
  }
  if (!device.empty()) {
    bool known = device == "unassigned";
    for (const DeviceInfo& d : dump->devices) known = known || d.name == device;
    if (!known) {
      std::string names;
      for (const DeviceInfo& d : dump->devices) names += (names.empty() ? "" : ", ") + d.name;
      std::fprintf(stderr, "exitscope inspect: --device %s: no such device in %s (devices: %s)\n",
                   device.c_str(), path.c_str(), names.empty() ? "none" : names.c_str());
      return 2;
    }
    o.filter.device = device;
  }
  try {
    const std::string out =
        html ? report::RenderExitHealthHtml(*dump, o) : report::ExitHealthReport(*dump, o);
    if (Status s = WriteOutput(output, out); !s) return ReportError("exitscope inspect", s.error());
  } catch (const std::exception& e) {  // never an abort: one line naming the input
    std::fprintf(stderr, "exitscope inspect: %s: cannot render the report: %s\n", path.c_str(),
                 e.what());
    return 1;
  }
  return 0;
}

}  // namespace exitscope::cli
