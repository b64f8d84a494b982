// A C++ VMM's vCPU loop reduced to one exit, built against an installed exitscope
// (find_package(exitscope), exitscope::exitscope). vmm_cxx OUT.esdump
#include <cstdio>
#include <string>

#include "exitscope/dump.h"
#include "exitscope/exitscope.h"
#include "exitscope/recorder.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  exitscope::RecorderOptions options;
  options.start_watchdog = false;
  auto rec = exitscope::Recorder::Create(options);
  if (!rec) {
    std::fprintf(stderr, "vmm_cxx: %s\n", rec.error().message.c_str());
    return 1;
  }
  auto uart = (*rec)->address_space().AddDevice({.name = "uart0", .kind = "uart16550"});
  if (!uart) return 1;
  if (!(*rec)->address_space().AddRange(exitscope::IoSpace::kPio, 0x3f8, 8, *uart)) return 1;
  (*rec)->BeginExit(0, exitscope::ExitKind::kPio, 0x3f8, 1, exitscope::AccessDir::kWrite, 'x');
  (*rec)->EndExit(0);
  if (auto s = (*rec)->WriteDump(argv[1]); !s) {
    std::fprintf(stderr, "vmm_cxx: %s\n", s.error().message.c_str());
    return 1;
  }
  auto back = exitscope::ReadDump(argv[1]);
  if (!back) return 1;
  std::printf("vmm_cxx: exitscope %s (headers %s): %zu exit recorded, dump %s\n", es_version(),
              ES_VERSION_STRING, back->vcpus.at(0).exits.size(), argv[1]);
  return back->vcpus.at(0).exits.size() == 1 ? 0 : 1;
}
