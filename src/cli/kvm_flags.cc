#include "cli/kvm_flags.h"

#include <cstdio>

#include "cli/parse_args.h"
#include "fmt/format.h"
#include "report/renderer.h"

namespace exitscope::cli {

void KvmAnalysisFlags::Add(CLI::App& app, const char* pid_help, const char* duration_help,
                           const char* format_help) {
  app.add_option("--event", event, "vmexit | userspace | ioport | mmio | msr | hypercall");
  app.add_option("--vcpu", vcpu, "only this vCPU")->check(kNonNegativeInteger);
  app.add_option("-p,--pid", pid, pid_help)->check(kNonNegativeInteger);
  app.add_option("-k,--key", key,
                 "sort rows by: sample | time | max | min | avg | p50 | p99 | p999");
  app.add_option("--duration", duration_us, duration_help)
      ->check(NumberIn(0, 3'600'000'000.0, "us"));
  app.add_flag("--percentiles", percentiles, "add p50 / p99 / p99.9 columns");
  app.add_flag("--per-vcpu", per_vcpu, "add one table per vCPU");
  app.add_flag("--per-vm", per_vm, "add one table per VM");
  app.add_flag("--histogram", histogram, "log-scale latency histogram per row");
  app.add_option("--format", format, format_help);
  app.add_option("--device-map", device_map,
                 "resolve ports / MMIO addresses: a recorder dump of the VM, a device-map "
                 "text file (docs/kvm.md) or QEMU's `info mtree -f` output (docs/qemu.md)");
  app.add_option("--qmp", qmp,
                 "resolve ports / MMIO addresses with QEMU's own region names, read live from "
                 "the running QEMU's QMP socket (-qmp unix:SOCKET,server=on,wait=off; "
                 "docs/qemu.md)");
  app.add_option("--pvm-numbering", pvm_numbering,
                 "PVM exit reason numbering: upstream | fork (ERETS removed)");
}

int KvmAnalysisFlags::Apply(const char* self, analysis::KvmAnalysisOptions* a,
                            report::KvmRenderOptions* r, sources::KvmPairerOptions* p,
                            std::unique_ptr<sources::KvmDeviceMap>* devices) const {
  if (!analysis::ParseKvmEventClass(event, &a->event)) {
    return UsageError(self, fmt::format("--event: unknown event '{}' (vmexit, userspace, ioport, "
                                        "mmio, msr, hypercall)",
                                        event));
  }
  if (!analysis::ParseKvmSortKey(key, &r->sort)) {
    return UsageError(self,
                      fmt::format("--key: unknown key '{}' (sample, time, max, min, avg, p50, "
                                  "p99, p999)",
                                  key));
  }
  if (auto r =
          report::FindRenderer(format, html_format ? report::Need::kFile : report::Need::kLive);
      !r) {
    return UsageError(self, r.error().message);
  }
  if (pvm_numbering == "upstream") {
    p->pvm = sources::PvmNumbering::kUpstream;
  } else if (pvm_numbering == "fork") {
    p->pvm = sources::PvmNumbering::kFork;
  } else {
    return UsageError(self,
                      fmt::format("--pvm-numbering: '{}' is not upstream or fork", pvm_numbering));
  }
  if (!device_map.empty() && !qmp.empty()) {
    return UsageError(self, "--device-map and --qmp exclude each other: give one device map");
  }
  if (!qmp.empty()) {
    auto m = sources::KvmDeviceMap::LoadQmp(qmp);
    if (!m) return ReportError(self, Error{m.error().code, "--qmp " + m.error().message});
    *devices = std::move(*m);
    p->devices = devices->get();
  }
  if (!device_map.empty()) {
    auto m = sources::KvmDeviceMap::Load(device_map);
    if (!m) {
      return ReportError(self, Error{m.error().code, "--device-map " + m.error().message});
    }
    *devices = std::move(*m);
    p->devices = devices->get();
  }
  a->vcpu = vcpu;
  a->pid = pid;
  a->per_vcpu = per_vcpu;
  a->per_vm = per_vm;
  a->slow_ns = static_cast<uint64_t>(duration_us * 1000.0 + 0.5);
  r->percentiles = percentiles;
  r->histogram = histogram;
  r->per_vcpu = per_vcpu;
  r->per_vm = per_vm;
  return 0;
}

}  // namespace exitscope::cli
