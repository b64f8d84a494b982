// cli/kvm_flags.h: the flags `exitscope kvm report`, `kvm live` and `kvm stat` share (what to
// analyse and how to render it), declared, validated and applied in one place.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "analysis/kvm_stats.h"
#include "report/kvm_report.h"
#include "sources/kvm_device_map.h"
#include "sources/kvm_pairing.h"

namespace exitscope::cli {

struct KvmAnalysisFlags {
  std::string event = "vmexit", key = "sample", format = "table", device_map, qmp;
  std::string pvm_numbering = "upstream";
  int64_t vcpu = -1, pid = -1;
  double duration_us = 0;
  bool percentiles = false, per_vcpu = false, per_vm = false, histogram = false;
  bool html_format = false;  // every --format (report/renderer.h), not only the live ones

  // Registers the flags on `app`. The help of -p, --duration and --format differs between
  // report and live, so the caller gives it.
  void Add(CLI::App& app, const char* pid_help, const char* duration_help, const char* format_help);

  // Validates the values and fills the options (the device map, if any, from --device-map
  // or live from QEMU through --qmp, is loaded into *devices and referenced from *pairer).
  // Returns 0, or prints one line "<self>: ..." and returns the exit status: 2 for bad usage
  // or bad input, 1 for a runtime failure.
  int Apply(const char* self, analysis::KvmAnalysisOptions* analysis,
            report::KvmRenderOptions* render, sources::KvmPairerOptions* pairer,
            std::unique_ptr<sources::KvmDeviceMap>* devices) const;
};

}  // namespace exitscope::cli
