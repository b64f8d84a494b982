// Fuzz target for the QMP client's parser of what QEMU sends (QmpHumanMonitorCommandOnFd,
// src/sources/qemu_qmp.h: greeting, events, answers, error replies, over-long lines) and,
// when an exchange succeeds, for the `info mtree -f` text it returns (KvmDeviceMap::
// FromQemuMtree, as `--qmp` uses it). The input is the byte stream the peer sends: a thread
// writes it into one end of a socketpair and shuts that end; the client reads the other.
//
// An input starting with "#!scale mtree N" (device_map_scale.h) is a whole exchange generated
// here: QEMU 7.2's greeting, the answer to qmp_capabilities, an event, and an answer holding
// an `info mtree -f` of N ranges (as JSON), then the rest of the input. Such a seed alone must
// succeed and load every range.
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "device_map_scale.h"
#include "fuzz_target.h"
#include "sources/kvm_device_map.h"
#include "sources/qemu_qmp.h"

using exitscope::AccessDir;
using exitscope::SubKeyKind;
using exitscope::sources::KvmDeviceMap;
using exitscope::sources::QmpHumanMonitorCommandOnFd;

namespace {

constexpr std::string_view kGreeting =
    "{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 22, \"minor\": 2, \"major\": 7}, "
    "\"package\": \"\"}, \"capabilities\": [\"oob\"]}}\r\n";

// The exchange a QEMU with this memory tree would send.
std::string Exchange(const std::string& mtree_and_rest) {
  std::string s(kGreeting);
  s += "{\"return\": {}}\r\n";
  s += "{\"timestamp\": {\"seconds\": 1, \"microseconds\": 2}, \"event\": \"RESUME\"}\r\n";
  s += nlohmann::json{{"return", mtree_and_rest}}.dump() + "\r\n";
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string scaled, stream;
  const auto scale = exitscope::fuzz::ExpandScaleDirective(input, &scaled);
  const bool must_load = scale == exitscope::fuzz::ScaleKind::kMtree &&
                         input.find('\n') + 1 == size && scaled.size() > 200;
  if (scale != exitscope::fuzz::ScaleKind::kNone) {
    stream = Exchange(scaled);
    input = stream;
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  std::thread peer([fd = sv[1], input] {
    size_t off = 0;
    while (off < input.size()) {
      const ssize_t n = ::send(fd, input.data() + off, input.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;  // the client stopped reading (an error) and closed its end
      off += static_cast<size_t>(n);
    }
    ::shutdown(fd, SHUT_WR);
  });
  auto text = QmpHumanMonitorCommandOnFd(sv[0], "fuzz.qmp", "info mtree -f", {.timeout_ms = 5000});
  ::shutdown(sv[0], SHUT_RDWR);  // unblocks the peer if the client gave up early
  peer.join();
  ::close(sv[0]);
  ::close(sv[1]);
  if (!text) {
    if (must_load) exitscope::fuzz::InvariantFailed("a generated QMP exchange failed");
    return 0;
  }
  auto m = KvmDeviceMap::FromQemuMtree(*text, "fuzz.qmp");
  if (!m) {
    if (must_load) exitscope::fuzz::InvariantFailed("a generated QMP answer did not load");
    return 0;
  }
  std::string_view device, reg;
  const bool first =
      (*m)->Resolve(SubKeyKind::kMmio, 0x100000000ull, 4, AccessDir::kRead, &device, &reg);
  if (must_load && (!first || device != "r0"))
    exitscope::fuzz::InvariantFailed("a generated QMP answer does not resolve its first range");
  for (const uint64_t addr : {0x0ull, 0x3f8ull, 0xcf8ull, 0xfebf0000ull, ~0ull}) {
    (void)(*m)->Resolve(SubKeyKind::kPort, addr, 1, AccessDir::kRead, &device, &reg);
    (void)(*m)->Resolve(SubKeyKind::kMmio, addr, 4, AccessDir::kWrite, &device, &reg);
  }
  return 0;
}
