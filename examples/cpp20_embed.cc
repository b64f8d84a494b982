// examples/cpp20_embed.cc: a C++20 VMM embedding the recorder, built with -std=c++20 -Wall
// -Wextra -Werror against libexitscope.so. It includes every public header and uses what a VMM
// uses: create, register devices and ranges, BeginExit / EndExit, device events, a dump.
//
//   cpp20_embed OUT.esdump   prints "dump written: OUT.esdump (N exits)" or one error line.
#include "exitscope/address_space.h"
#include "exitscope/clock.h"
#include "exitscope/device_events.h"
#include "exitscope/dump.h"
#include "exitscope/exit_record.h"
#include "exitscope/exitscope.h"
#include "exitscope/export.h"
#include "exitscope/flight_recorder.h"
#include "exitscope/recorder.h"
#include "exitscope/register_map.h"
#include "exitscope/status.h"
#include "exitscope/unassigned_log.h"
#include "exitscope/watchdog.h"

#if __cplusplus != 202002L
#error "this example checks the public headers in C++20"
#endif

#include <cstdio>
#include <memory>
#include <string>

namespace {

using exitscope::AccessDir;
using exitscope::ExitKind;
using exitscope::IoSpace;

constexpr uint64_t kNvmeBar = 0xfebf0000;
constexpr uint16_t kUartPort = 0x3f8;

exitscope::Result<uint32_t> AddNvme(exitscope::Recorder& rec) {
  auto map = exitscope::RegisterMap::Builtin("nvme");
  if (!map) return exitscope::Propagate(map);
  auto dev = rec.address_space().AddDevice({.name = "nvme0", .kind = "nvme", .id = 0x0300});
  if (!dev) return exitscope::Propagate(dev);
  EXITSCOPE_RETURN_IF_ERROR(
      rec.address_space().AddRange(IoSpace::kMmio, kNvmeBar, 0x4000, *dev, *map));
  return *dev;
}

exitscope::Status Run(const std::string& out) {
  exitscope::RecorderOptions options;
  options.num_vcpus = 2;
  options.events_per_vcpu = 256;
  options.start_watchdog = false;
  auto rec = exitscope::Recorder::Create(options);
  if (!rec) return exitscope::Propagate(rec);
  exitscope::Recorder& r = **rec;

  auto nvme = AddNvme(r);
  if (!nvme) return exitscope::Propagate(nvme);
  auto uart = r.address_space().AddDevice({.name = "uart0", .kind = "uart16550"});
  if (!uart) return exitscope::Fail(exitscope::ErrorCode::kInternal, uart.error().message);
  if (exitscope::Status s = r.address_space().AddRange(IoSpace::kPio, kUartPort, 8, *uart); !s)
    return s;

  for (uint32_t i = 0; i < 16; ++i) {
    const uint32_t vcpu = i % 2;
    r.BeginExit(vcpu, ExitKind::kMmio, kNvmeBar + 0x1008, 4, AccessDir::kWrite, i);
    r.IoSubmit(*nvme, i);
    r.EndExit(vcpu);
    {
      exitscope::Recorder::ExitScope scope(&r, vcpu, ExitKind::kPio, kUartPort, 1,
                                           AccessDir::kRead);
      scope.set_value('x');
    }
    r.IoComplete(*nvme, i, 0);
  }
  r.Note(*nvme, "embedded from C++20");

  const exitscope::Dump snap = r.Snapshot();
  size_t exits = 0;
  for (const auto& v : snap.vcpus) exits += v.exits.size();
  EXITSCOPE_RETURN_IF_ERROR(r.WriteDump(out));
  auto back = exitscope::ReadDump(out);
  if (!back) return exitscope::Propagate(std::move(back));
  std::printf("dump written: %s (%zu exits, %zu devices)\n", out.c_str(), exits,
              back->devices.size());
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: cpp20_embed OUT.esdump\n");
    return 2;
  }
  if (exitscope::Status s = Run(argv[1]); !s) {
    std::fprintf(stderr, "cpp20_embed: %s\n", s.error().message.c_str());
    return 1;
  }
  return 0;
}
